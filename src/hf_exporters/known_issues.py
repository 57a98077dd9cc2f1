"""Model classes the exporters handle differently, each with its reason.

``ONNX_DISABLE_OPTIMIZE`` entries name the upstream report (``owner/repo#N`` or a URL) and are
expected to go when that report is fixed; a test refuses an entry without one.

``EXPORT_SKIPS`` entries are model-side: each names the change the model needs. The sweep counts a
skip as a skip, never as a pass, and ``hf-exporters sweep --recheck-skips`` reruns every skipped
class and lists the entries that now pass, so the list shrinks.
"""

from __future__ import annotations

#: model class name -> the upstream onnxscript optimizer bug that forces ``OnnxConfig.optimize`` off
ONNX_DISABLE_OPTIMIZE: dict[str, str] = {}

#: the scopes of :data:`EXPORT_SKIPS`: ``all`` (every backend, static and dynamic), ``dynamic`` (every
#: backend, dynamic shapes only), a backend (``dynamo``, ``onnx``, ``executorch``: static and dynamic),
#: or ``<backend>.dynamic`` (that backend, dynamic only)
SKIP_SCOPES: tuple[str, ...] = (
    "all",
    "dynamic",
    "dynamo",
    "onnx",
    "executorch",
    "dynamo.dynamic",
    "onnx.dynamic",
    "executorch.dynamic",
)

#: scope -> {model class name: why that export is skipped, naming the model-side change it needs}
EXPORT_SKIPS: dict[str, dict[str, str]] = {scope: {} for scope in SKIP_SCOPES}

_QWEN2_VL_LAYOUT = (
    "the text side reads the multimodal layout from data: get_rope_index groups mm_token_type_ids with "
    "itertools.groupby(input_token_type.tolist()) and the image features are split with "
    "image_grid_thw.prod(-1).tolist() (GuardOnDataDependentSymNode Eq(u7, 0) at modeling_qwen2_vl.py:964; "
    "case H11, pytorch/pytorch#158786). The vision tower itself exports (its per-image attention split "
    "is replaced by one block-diagonal attention call at the dynamo stage). model-side change needed: "
    "M-RoPE position ids from tensor ops over mm_token_type_ids (a cumsum per modality run), or taken "
    "as an input, and image token counts from static grid sizes"
)
#: Qwen2VLModel left the list: on text inputs (the sweep's) it exports since the vision attention
#: patch, and the image path is the generative class's case (H11)
EXPORT_SKIPS["all"].update({"Qwen2VLForConditionalGeneration": _QWEN2_VL_LAYOUT})


def skip_reason(model_class: str, backend: str, dynamic: bool) -> str | None:
    """The reason ``model_class`` is skipped for ``backend`` (static or ``dynamic``), or None.

    The broadest scope that applies wins: ``all``, then ``dynamic``, then the backend, then
    ``<backend>.dynamic``. The reason is prefixed with its scope (``[onnx] ...``).
    """
    scopes = ["all", backend]
    if dynamic:
        scopes[1:1] = ["dynamic"]
        scopes.append(f"{backend}.dynamic")
    for scope in scopes:
        reason = EXPORT_SKIPS.get(scope, {}).get(model_class)
        if reason:
            return f"[{scope}] {reason}"
    return None
