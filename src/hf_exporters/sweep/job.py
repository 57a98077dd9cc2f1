"""One sweep job: (model class, backend, dynamic, engine, cache kind) -> an outcome record.

:func:`run_job` runs in a process of its own (see :mod:`hf_exporters.sweep.runner`): tiny config,
inputs, eager, signal, export, runtime, parity. Every failure is caught and recorded with its stage, the
error kind (:func:`classify`), the source line blamed and a one-line message.

Signal: before anything is exported, eager's outputs must carry signal (:data:`~.signal_check.RULE`);
a model whose outputs do not is the setup failure ``degenerate model`` (stage ``signal``), never a
pass. Every forward job records the figures it was judged on (``signal``: per output max |x|, std and
the change between two input sets) and, once compared, ``max_abs_diff``, ``max_rel_diff`` and ``leaf_diffs``
(per compared output leaf, caches included, its max abs diff).

Cache kinds (:data:`CACHE_KINDS`, ``spec["cache"]``) of a forward job: ``default`` builds the model with
``use_cache`` as its config has it, so a decoder returns its cache and every tensor of that cache is an output
leaf the signal and parity checks judge; ``off`` sets ``use_cache=False`` in the config and its sub-configs
(a spec or record without ``cache`` is ``off``, the only kind before kinds existed). A class whose config has no
``use_cache`` field (:func:`has_use_cache`) has one job, of kind ``default``.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import time
import traceback
from typing import Any

#: the stages a job goes through, in order (an exporter failure is "exporter <stage title>")
STAGES = ("tiny config", "inputs", "eager", "signal", "exporter", "lowering", "runtime", "parity")
#: outcomes recorded by the runner when the job's process did not report
PROCESS_OUTCOMES = ("timeout", "crash", "oom")
ENGINES = ("ours", "upstream")
BACKENDS = ("dynamo", "onnx", "executorch")
#: cache kinds of a forward job: the model's own ``use_cache`` (the headline), or ``use_cache=False``
CACHE_KINDS = ("default", "off")

#: (error kind, pattern on the message or the exception type) — first match wins
ERROR_KINDS: list[tuple[str, re.Pattern[str]]] = [
    ("tiny config too large", re.compile(r"tiny config still has", re.I)),
    ("nondeterministic forward", re.compile(r"nondeterministic forward", re.I)),
    ("degenerate model", re.compile(r"^degenerate model:", re.I)),
    ("call signature", re.compile(r"missing \d+ required positional argument|unexpected keyword argument|takes \d+ positional argument", re.I)),
    ("out of memory", re.compile(r"MemoryError|out of memory|Cannot allocate memory|bad_alloc", re.I)),
    ("data-dependent guard", re.compile(r"data.dependent|GuardOnDataDependentSymNode|unbacked|DataDependentOutputException|Could not extract specialized integer", re.I)),
    ("specialised axis", re.compile(r"specializ|specialis|Constraints violated|ended static|not in range \[|ConstraintViolation|is not equal to|marked .* as dynamic", re.I)),
    ("dynamic control flow", re.compile(r"control flow|torch\.cond|Dynamic slicing|GuardOnDataDependent", re.I)),
    ("unsupported op", re.compile(r"No ONNX function found|DispatchError|not supported|unsupported|no decomposition|NotImplementedError|Could not run '|is not implemented|Missing out variant|operator .* not found|No kernel", re.I)),
    ("eager differs when traced", re.compile(r"computes differently when traced", re.I)),
    ("token id mismatch", re.compile(r"token ids differ from eager", re.I)),
    ("numeric mismatch", re.compile(r"differ from eager beyond|NaN/inf where eager", re.I)),
    ("output structure mismatch", re.compile(r"returned \d+ outputs where eager|artifact shape .* != eager shape", re.I)),
    ("onnxruntime error", re.compile(r"ONNXRuntimeError|onnxruntime|\[ONNX", re.I)),
    ("pytree / output type", re.compile(r"pytree|is not a registered|unflatten|TreeSpec|ModelOutput", re.I)),
    ("unsupported python in trace", re.compile(r"Unsupported:|graph break|UserError|torch\._dynamo\.exc", re.I)),
    ("input mismatch", re.compile(r"inputs? (do not|does not) match|Missing input|takes \d+ inputs|requires .* which the sweep|kwarg keyword mismatch", re.I)),
    ("no forward", re.compile(r"defines no forward")),
    ("class not importable", re.compile(r"transformers has no attribute", re.I)),
    ("shape error", re.compile(r"shape|size mismatch|must match the size|dimension|cannot reshape|view size|expected input\[.*channels|index k out of range", re.I)),
    ("dtype error", re.compile(r"dtype|expected scalar type|type mismatch", re.I)),
    ("missing dependency", re.compile(r"requires the .* library|No module named|ImportError", re.I)),
    ("config validation", re.compile(r"validation error|validate_architecture|must be a subset|must equal|must match", re.I)),
    ("timeout", re.compile(r"^timeout", re.I)),
    ("crash", re.compile(r"killed by signal|exit code", re.I)),
]


def classify(message: str, outcome: str = "fail") -> str:
    """The error kind of a failure message (see :data:`ERROR_KINDS`); ``other: <ExceptionType>`` otherwise."""
    if outcome in ("timeout", "oom"):
        return {"timeout": "timeout", "oom": "out of memory"}[outcome]
    for kind, pattern in ERROR_KINDS:
        if pattern.search(message or ""):
            return kind
    exc = (message or "").split(":", 1)[0].strip()
    return f"other: {exc}" if exc and " " not in exc else "other"


def _own_blame(error: BaseException) -> str | None:
    from ..exporters._common import blamed_line

    try:
        return blamed_line(error)
    except Exception:  # noqa: BLE001
        return None


def _first_line(error: BaseException) -> str:
    from ..exporters._common import first_line

    return first_line(error, limit=300)


class _Failed(Exception):
    def __init__(self, stage: str, error: BaseException, message: str | None = None, blamed: str | None = None):
        self.stage = stage
        self.error = error
        self.message = message or _first_line(error)
        self.blamed = blamed if blamed is not None else _own_blame(error)


def _at(stage: str):  # noqa: ANN202 - a tiny context manager factory
    @contextlib.contextmanager
    def block():  # noqa: ANN202
        try:
            yield
        except _Failed:
            raise
        except BaseException as error:  # noqa: BLE001
            if isinstance(error, (KeyboardInterrupt, SystemExit)):
                raise
            raise _Failed(stage, error) from error

    return block()


def _configs(config: Any) -> list[Any]:
    """``config`` and every sub-config reachable through its attributes (each once)."""
    from transformers import PretrainedConfig

    out, stack, seen = [], [config], set()
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        out.append(current)
        stack.extend(v for v in vars(current).values() if isinstance(v, PretrainedConfig))
    return out


def has_use_cache(config: Any) -> bool:
    """Whether ``config`` or one of its sub-configs has a ``use_cache`` field (its jobs then run as two cache kinds)."""
    return any(hasattr(c, "use_cache") for c in _configs(config))


def _declares_use_cache(config_class: type, seen: set[type] | None = None) -> bool:
    """Whether ``config_class`` or a config class of its ``sub_configs`` declares ``use_cache`` (read from the classes)."""
    seen = set() if seen is None else seen
    if config_class in seen:
        return False
    seen.add(config_class)
    if hasattr(config_class, "use_cache"):
        return True
    subs = getattr(config_class, "sub_configs", None) or {}
    return any(isinstance(c, type) and _declares_use_cache(c, seen) for c in subs.values())


def class_has_use_cache(class_name: str) -> bool:
    """:func:`has_use_cache` of the default config of ``class_name``'s config class (what the tiny config starts
    from); when that config cannot be built, whether the config classes declare the field; False for a class that
    cannot be imported (its one job fails at ``tiny config`` and says why)."""
    from .classes import resolve

    try:
        config_class = resolve(class_name).config_class
    except Exception:  # noqa: BLE001
        return False
    import warnings

    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # a default config's validation warnings say nothing of the sweep
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return has_use_cache(config_class())
    except Exception:  # noqa: BLE001
        return _declares_use_cache(config_class)
    finally:
        hf_logging.set_verbosity(verbosity)


def _no_cache(config: Any) -> None:
    """``use_cache=False`` in the config and its sub-configs (the ``off`` cache kind)."""
    for current in _configs(config):
        if hasattr(current, "use_cache"):
            with contextlib.suppress(Exception):  # a read-only property on some configs
                current.use_cache = False


VANISHING_CONVOLUTIONS: dict[str, str] = {
    family: "its HGNetV2 backbone draws every convolution from N(0, 0.02) and its BatchNorms keep untrained"
    " statistics (identity in eval mode), so each conv divides the signal about fourfold; the tiny encoder's"
    " features reach zero and the top-k query selection picks among exact ties, which eager and"
    " onnxruntime break differently"
    for family in ("d_fine", "deimv2", "pp_doclayout_v2", "pp_doclayout_v3", "pp_doclayout_v4")
} | {
    family: "its decoder upsamples the quantized latents through transposed convolutions and residual units with no"
    " normalisation between them, each layer dividing the signal at the init scale while the biases stay: the tiny"
    f" model's decoded audio changed by {change} between two inputs, below the signal floor (sweep.signal_check); with"
    f" {how} at a gain of one it carries signal"
    for family, change, how in (
        ("encodec", "3e-5", "its weight-normalised convolutions, transposed ones included,"),
        ("dac", "1.5e-5", "its (plain) convolutions"),
    )
}


#: model types whose contrastive logits are multiplied by a ``*logit_scale`` parameter initialised to 0 (PE Audio's
#: audio-text, PE Video's and PE Audio-Video's scales), not by its ``exp``
LINEAR_LOGIT_SCALES = ("pe_audio", "pe_video", "pe_audio_video")


def _draw(weight: Any, std: float, generator: Any) -> None:
    """Fill ``weight`` in place from N(0, ``std``), drawn in float32 with ``generator`` (seeded: reproducible)."""
    import torch

    weight.copy_(torch.randn(weight.shape, generator=generator, dtype=torch.float32).to(weight.dtype) * std)


def undo_degenerate_init(model: Any, std: float) -> list[str]:
    """Give ``model`` the weights a trained network could have where its family's init leaves a
    sublayer constant or silent; returns the names of the weights changed.

    - An all-zero ``nn.Linear`` weight is drawn from N(0, ``std``). Several families initialise a
      projection to zero (MoE routers such as AFMoE's, deformable attention's sampling offsets,
      D-FINE's gateway); every output of a zero projection has the same value, so a ``topk`` or
      ``argmax`` over it picks among exact ties.
    - A BatchNorm scale drawn near zero (every |gamma| < 0.5, as RT-DETR's init draws them from
      N(0, 0.02)) is set to 1. Each such layer shrinks the activations about fifty-fold, and after a
      few of them the features are zero to float precision: the detection heads then score every
      anchor the same, and a tiny model whose outputs are constant passes any parity check.

    - In the families of :data:`LINEAR_LOGIT_SCALES`, a logit scale parameter (a name ending in ``logit_scale``)
      that is exactly zero is set to 1: their similarity logits are multiplied by the scale itself, not by its
      ``exp`` (as CLIP's and SigLIP's are, where 0 is a scale of 1), so at the zero init every logit is 0.
    - In the families of :data:`VANISHING_CONVOLUTIONS` (keyed by ``config.model_type``), a convolution
      (not transposed) whose gain ``std(weight) * sqrt(fan_in)`` is below 0.3 is drawn from N(0, 1 / fan_in),
      a gain of one: every such convolution of the model, backbone or head, a zero-initialised one too. A
      weight-normalised convolution (transposed too) of these families below a gain of 0.9 is scaled to one
      (:func:`_unit_gain_weight_norm_convolutions`). Only these families: elsewhere such a convolution is followed by
      a normalisation that restores the scale, and re-drawing it would change a tiny model for nothing.

    Eager and each runtime break ties their own way, so without this the sweep reports numeric
    mismatches that no trained checkpoint can show. Drawn with a fixed seed: the tiny model stays
    reproducible.
    """
    import math

    import torch

    generator = torch.Generator().manual_seed(0)
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    redraw_convolutions = model_type in VANISHING_CONVOLUTIONS
    changed = []
    with torch.no_grad():
        for name, parameter in model.named_parameters() if model_type in LINEAR_LOGIT_SCALES else ():
            if name.endswith("logit_scale") and parameter.numel() == 1 and not parameter.any():
                parameter.fill_(1.0)
                changed.append(name)
        for name, module in model.named_modules():
            weight = getattr(module, "weight", None)
            if not isinstance(weight, torch.nn.Parameter) or not weight.numel():
                continue
            if isinstance(module, torch.nn.Linear) and not weight.any():
                _draw(weight, std, generator)
            elif isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and bool((weight.abs() < 0.5).all()):
                weight.fill_(1.0)
            elif redraw_convolutions and isinstance(module, torch.nn.modules.conv._ConvNd) and not module.transposed and weight.numel() > 1:
                fan_in = weight[0].numel()
                if weight.float().std().item() * math.sqrt(fan_in) >= 0.3:
                    continue
                _draw(weight, 1 / math.sqrt(fan_in), generator)
            else:
                continue
            changed.append(f"{name}.weight")
        if redraw_convolutions:
            changed += _unit_gain_weight_norm_convolutions(model)
    return changed


def _unit_gain_weight_norm_convolutions(model: Any) -> list[str]:
    """Scale every weight-normalised convolution of ``model`` (``weight = g * v / |v|``, the ``original0`` and
    ``original1`` of a ``torch.nn.utils.parametrizations.weight_norm``), transposed ones included, whose gain
    ``std(weight) * sqrt(fan_in)`` is below 0.9 to a gain of one, by scaling ``g``; returns the names scaled.

    A transposed convolution's fan-in is ``in_channels / groups * kernel / stride`` (the inputs each output sums
    over). Encodec's decoder upsamples through such layers, each dividing the signal about threefold at the init
    scale, with residual units whose biases then dominate: the decoded audio ends the same for every input."""
    import math

    import torch
    from torch.nn.utils import parametrize

    changed = []
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.modules.conv._ConvNd) or not parametrize.is_parametrized(module, "weight"):
            continue
        parametrization = module.parametrizations.weight
        if not hasattr(parametrization, "original0"):
            continue
        weight = module.weight
        if module.transposed:
            fan_in = weight.shape[0] // module.groups * weight[0, 0].numel() / math.prod(module.stride)
        else:
            fan_in = weight[0].numel()
        gain = weight.float().std().item() * math.sqrt(fan_in)
        if 0 < gain < 0.9:
            parametrization.original0.mul_(1.0 / gain)
            changed.append(f"{name}.parametrizations.weight.original0")
    return changed


#: class-name endings of the task heads whose output projections :func:`unit_gain_task_head` draws at a gain of one
TASK_HEADS = ("Classification", "ForMultipleChoice", "ForQuestionAnswering")
#: the top-level children that make a task head when the head class has no separate base model (``model.base_model
#: is model``: Whisper's audio classifier keeps its ``encoder`` beside ``projector`` and ``classifier``, SigLIP's image
#: classifier its ``vision_model`` beside ``classifier``); every other child is the body
_HEAD_CHILDREN = ("classifier", "score", "qa_outputs", "projector", "pre_classifier", "classification_head")


def unit_gain_task_head(model: Any, class_name: str) -> list[str]:
    """Draw the linear layers of a task head (a class named as in :data:`TASK_HEADS`) whose gain
    ``std(weight) * sqrt(fan_in)`` is below 0.3 from N(0, 1 / fan_in), a gain of one; returns their names.

    The head is every top-level child of ``model`` other than its base model (without a separate base model, the
    children named in :data:`_HEAD_CHILDREN`); a weight the body shares (a tied projection) is left alone. Drawn at the
    init scale (0.02 at the tiny width 64: a gain of 0.16), a pooler-dense-classifier head shrinks the hidden states
    about fortyfold: the logits of MRA, RoFormer, ConvBERT, YOSO (multiple choice, sequence classification), WavLM,
    SEW-D and Whisper (audio classification) ended below the signal floor (:mod:`~.signal_check`) or the same for
    every input, degenerate models; a trained head has no such scale. Seeded: the tiny model stays reproducible."""
    import math

    import torch

    if not class_name.endswith(TASK_HEADS):
        return []
    base = getattr(model, "base_model", model)
    heads = [
        (name, child) for name, child in model.named_children()
        if (child is not base if base is not model else name in _HEAD_CHILDREN)
    ]
    head_ids = {id(child) for _, child in heads}
    shared = {
        p.data_ptr() for name, child in model.named_children() if id(child) not in head_ids for p in child.parameters()
    }
    generator = torch.Generator().manual_seed(0)
    changed = []
    with torch.no_grad():
        for child_name, child in heads:
            for name, module in child.named_modules():
                if not isinstance(module, torch.nn.Linear) or module.weight.numel() < 2 or module.weight.data_ptr() in shared:
                    continue
                weight = module.weight
                fan_in = weight.shape[1]
                if float(weight.float().std()) * math.sqrt(fan_in) >= 0.3:
                    continue
                _draw(weight, 1 / math.sqrt(fan_in), generator)
                changed.append(f"{child_name}.{name}" if name else child_name)
    return changed


def _calibrate(model: Any) -> list[str]:
    """Running statistics of the model's batch normalisations and entries of its all-zero codebooks, taken from the
    sweep's own inputs (:func:`~.tiny.calibrate_from_inputs`); nothing when the model has neither, or when its
    inputs or the calibrating forward fail (the job's own inputs and eager stages then say why)."""
    from .tiny import calibrate_from_inputs, has_calibration

    if not any(has_calibration(m) for m in model.modules()):
        return []
    from .inputs import build_inputs

    try:
        return calibrate_from_inputs(model, build_inputs(model))
    except Exception:  # noqa: BLE001 - the job's inputs and eager stages report the failure
        return []


def _head_fields(class_name: str, config: Any) -> list[str]:
    """Set the config fields a task head reads that a base model's config may leave unset; returns what was set.

    A ``*ForSequenceClassification`` head pools each row's last token that is not padding, and refuses a batch
    of more than one row without ``pad_token_id`` ("Cannot handle batch sizes > 1 if no padding token is
    defined"): it gets ``pad_token_id = 0`` (on the text config too), an id the sweep's inputs never draw
    (:func:`~.inputs.build_inputs` draws ids from 1), so every row pools its last token. An extractive
    ``*ForQuestionAnswering`` head splits its logits into start and end, so it gets ``num_labels = 2`` (the tiny
    config has 3: :func:`~.tiny.tiny_config`)."""
    if class_name.endswith("ForQuestionAnswering") and getattr(config, "num_labels", 2) != 2:
        config.num_labels = 2
        return ["config.num_labels = 2"]
    if not class_name.endswith("ForSequenceClassification"):
        return []
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    changed = []
    for where, part in [("config", config)] + ([("text config", text)] if text is not config else []):
        if getattr(part, "pad_token_id", None) is None:
            part.pad_token_id = 0
            changed.append(f"{where}.pad_token_id = 0")
    return changed


def build_model(class_name: str, use_cache: bool | None = False) -> Any:
    """The tiny model of ``class_name`` (seeded, eval mode).

    ``use_cache``: False sets ``use_cache=False`` in the config and its sub-configs (the ``off`` cache kind);
    None leaves it as the config has it (the ``default`` kind); True leaves it too and makes an encoder family's
    ``ForCausalLM`` a decoder (generation).

    Built from :func:`~.tiny.tiny_config` (init scales raised to a floor), its degenerate init undone
    (:func:`undo_degenerate_init`), a task head's projections at a gain of one (:func:`unit_gain_task_head`), its batch normalisations and all-zero codebooks calibrated on the sweep's
    inputs (:func:`_calibrate`), so that its outputs carry signal (:mod:`~.signal_check`)."""
    import torch

    from .classes import resolve
    from .tiny import MAX_PARAMETERS, parameter_count, tiny_config

    cls = resolve(class_name)
    config = tiny_config(cls.config_class)
    if use_cache is False:
        _no_cache(config)
    elif use_cache and class_name.endswith("ForCausalLM") and getattr(config, "is_decoder", None) is False:
        config.is_decoder = True  # encoder families (BERT, RoBERTa, ...) cache and mask causally only as decoders
    _head_fields(class_name, config)
    torch.manual_seed(0)
    model = cls(config).eval()
    undo_degenerate_init(model, getattr(config, "initializer_range", None) or 0.02)
    unit_gain_task_head(model, class_name)
    _calibrate(model)
    count = parameter_count(model)
    if count > MAX_PARAMETERS:
        raise ValueError(f"tiny config still has {count:,} parameters (limit {MAX_PARAMETERS:,})")
    return model


def _upstream_export(backend: str, model: Any, inputs: dict[str, Any], dynamic: bool) -> tuple[Any, dict[str, Any]]:
    """Export with transformers' own exporter; returns ``(program, prepared inputs)``.

    Upstream's ``prepare_for_export`` writes the inputs it precomputes (``cu_seqlens``, ``position_ids``,
    window indices of vision towers on flattened patches, ...) into the sample-input mapping it is given,
    in place, and the program is traced with them: upstream runs its artifact with that mapping (its
    ExecuTorch preparation says so: "in place, so precomputed kwargs reach the caller"). The sweep hands
    it a copy of its inputs and runs the artifact with the copy as the export left it."""
    from transformers import exporters as upstream

    exporter_cls, config_cls = {
        "dynamo": (upstream.DynamoExporter, upstream.DynamoConfig),
        "onnx": (upstream.OnnxExporter, upstream.OnnxConfig),
        "executorch": (upstream.ExecutorchExporter, upstream.ExecutorchConfig),
    }[backend]
    prepared = dict(inputs)
    program = exporter_cls().export(model, prepared, config_cls(dynamic=dynamic)).program
    return program, prepared


def upstream_prepared(model: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """``inputs`` as upstream's ``prepare_for_export`` leaves them (a copy; its precomputed inputs added):
    how upstream's artifact takes an input set other than the one it was exported with."""
    from transformers.exporters.utils import prepare_for_export

    prepared = dict(inputs)
    _, cast, _ = prepare_for_export(model, prepared)
    return dict(cast)


def _upstream_stage(error: BaseException) -> str:
    """Where an upstream export failed: ``lowering`` when the innermost frames are torch.onnx or
    executorch.exir, ``exporter trace`` otherwise."""
    frames: list[traceback.FrameSummary] = []
    current: BaseException | None = error
    while current is not None and len(frames) < 2000:
        frames += traceback.extract_tb(current.__traceback__)
        current = current.__cause__ or current.__context__
    files = " ".join(f.filename for f in frames[-30:])
    if "/torch/onnx/" in files or "/onnxscript/" in files or "/executorch/exir/" in files:
        if "/torch/export/" not in files and "/torch/_dynamo/" not in files:
            return "lowering"
    return "exporter trace"


def _exported_program(program: Any) -> Any:
    import torch

    if isinstance(program, torch.export.ExportedProgram):
        return program
    ep = getattr(program, "exported_program", None)
    if callable(ep):
        try:
            ep = ep()
        except Exception:  # noqa: BLE001
            return None
    return ep if isinstance(ep, torch.export.ExportedProgram) else None


#: inputs with a length axis (samples, frames) besides the token-like ones
_LENGTH_INPUTS = ("input_values",)

#: name endings of integer inputs that hold coordinates, not tokens: a row per image or batch entry and a
#: fixed number of columns, ``(t, h, w)`` grids (``image_grid_thw``, ``video_grid_thw``, ``grid_thw``) and
#: ``(h, w)`` sizes (``spatial_shapes``, ``image_sizes``, ``target_sizes``); the column count is the model's
_COORDINATE_INPUTS = ("grid_thw", "spatial_shapes", "_sizes")


def expected_dynamic_axes(name: str, tensor: Any) -> set[int]:
    """The axes of an input a dynamic export must keep dynamic for the job to pass.

    The batch axis (0) of every input, and the length axis (1) of token-like inputs (integer or
    boolean tensors of shape ``(batch, sequence)``: ids, masks, positions; not coordinate inputs such as
    ``image_grid_thw`` ``(images, 3)`` or ``spatial_shapes`` ``(batch, 2)``, whose columns are fixed) and of raw audio
    (``input_values``: ``(batch, samples)``, a waveform ``(batch, 1 or 2 channels, samples)``, or
    frames ``(batch, frames, mel bins)``). Every axis is asked to be dynamic; the others (channels,
    mel bins, image height and width, feature widths) may be fixed by the model's weights or
    position tables, so a program that fixes them is recorded (``static_axes``) but not failed.
    """
    import torch

    axes = {0} if tensor.dim() >= 1 else set()
    coordinates = name.endswith(_COORDINATE_INPUTS)
    token_like = tensor.dim() == 2 and not coordinates and (tensor.dtype == torch.bool or not tensor.is_floating_point())
    if token_like:
        axes.add(1)
    elif name in _LENGTH_INPUTS and tensor.dim() >= 2:
        # a mono or stereo waveform (batch, 1 or 2, samples) has its length last; other layouts put it at axis 1
        waveform = tensor.dim() == 3 and tensor.shape[1] <= 2
        axes.add(2 if waveform else 1)
    return axes


def _take_second_set(model: Any, second: dict[str, Any] | None, record: dict[str, Any]) -> Any:
    """Eager's outputs for ``second`` (the parity check's expected values, so eager runs it once), or None
    when there is no second set or eager refuses it (recorded as ``second_input_set``)."""
    from ..runtime.compare import eager_outputs

    if second is None:
        return None
    try:
        expected = eager_outputs(model, second)
    except Exception:  # noqa: BLE001 - any refusal means the model does not take these sizes
        record["second_input_set"] = "eager refused the resized inputs"
        return None
    return expected


def _unexpected_static(fixed: list[tuple[str, int, int]], inputs: dict[str, Any]) -> list[tuple[str, int, int]]:
    """The ``(input, axis, size)`` entries of ``fixed`` on an axis :func:`expected_dynamic_axes` expects dynamic.

    An axis of size 1 is left out: ``torch.export`` specialises sizes 0 and 1 whatever is asked (a
    family fed one sample, :data:`~hf_exporters.sweep.inputs.SINGLE_SAMPLE`), and the upstream ONNX
    path, which has no ExportedProgram to read, only sees axes of size >= 2 as well."""
    from ..shapes import tensor_leaves

    tensors = dict(tensor_leaves(inputs))
    return [(n, a, s) for n, a, s in fixed if s >= 2 and (n not in tensors or a in expected_dynamic_axes(n, tensors[n]))]


def _onnx_ir_resized(model: Any, inputs: dict[str, Any], grow: int = 3) -> tuple[Any, list[str]]:
    """For an ``onnx_ir.Model`` without its ExportedProgram: the inputs with every symbolic graph-input
    batch or length axis (:func:`expected_dynamic_axes`) grown by ``grow`` (same symbol, same size), and the axes (of size >= 2) that ended static, as
    ``(input name, axis, size)``."""
    from ..runtime.compare import _resize
    from ..shapes import tensor_leaves

    leaves = tensor_leaves(inputs)
    by_name = dict(leaves)
    graph_inputs = list(model.graph.inputs)
    names = [v.name for v in graph_inputs]
    pairs = [(n, by_name[n]) for n in names if n in by_name] if all(n in by_name for n in names) else list(zip(names, (t for _, t in leaves)))
    fixed: list[tuple[str, int, int]] = []
    sizes: dict[str, int] = {}
    resized = dict(inputs)
    for (name, tensor), value in zip(pairs, graph_inputs):
        shape = value.shape
        if shape is None:
            continue
        for axis, dim in enumerate(shape):
            if isinstance(dim, int):
                if tensor.shape[axis] >= 2:
                    fixed.append((name, axis, dim))
                continue
            old = int(tensor.shape[axis])
            if old < 2 or axis not in expected_dynamic_axes(name, tensor):
                continue  # no guards to say which sizes the model takes: only batch and length axes grow
            size = sizes.setdefault(str(dim), old + grow)
            if name in resized:
                resized[name] = _resize(resized[name], axis, size).clone()
    return (resized if sizes else None), fixed


def _save(exporter: Any, program: Any, directory: str) -> Any:
    """Write ``program`` where ``exporter.load_runner`` reads it: upstream's ONNX program is an
    ``onnx_ir.Model`` (no ``save``), written with ``onnx_ir.save``."""
    from pathlib import Path

    if exporter.name == "onnx" and not hasattr(program, "save"):
        import onnx_ir

        path = Path(directory) / exporter.artifact_name
        onnx_ir.save(program, str(path), external_data=path.name + ".data")
        return path
    if exporter.name == "executorch" and not hasattr(program, "buffer") and hasattr(program, "write_to_file"):
        path = Path(directory) / exporter.artifact_name
        with open(path, "wb") as handle:
            program.write_to_file(handle)
        return path
    return exporter.save(program, directory)


def _load_runner(exporter: Any, artifact: Any, runtime: str) -> Any:
    """The artifact's runner: the backend's Python runtime, or the C++ runner (``runtime="cpp"``,
    ExecuTorch programs) through its bindings."""
    if runtime == "cpp" and exporter.name == "executorch":
        from ..runtime.cpp_runner import CppExecutorchRunner

        return CppExecutorchRunner(artifact)
    return exporter.load_runner(artifact)


def _probe(kind: str) -> None:
    """Test seams for the runner: a job that crashes, hangs or eats memory on purpose."""
    if kind == "crash":
        import faulthandler

        faulthandler.disable()  # no stack dump on the way down: the crash is the point
        os.abort()
    if kind == "hang":
        time.sleep(3600)
    if kind == "oom":
        hog = []
        while True:
            hog.append(bytearray(64 * 1024 * 1024))
            for i in range(0, len(hog[-1]), 4096):
                hog[-1][i] = 1
    if kind == "raise":
        raise RuntimeError("Could not guard on data-dependent expression u0 > 0 (probe)")


def run_job(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one job and return its record (never raises for a model failure).

    ``spec``: ``class``, ``backend``, ``dynamic``, ``engine`` ("ours" | "upstream"), optional ``cache``
    (:data:`CACHE_KINDS`; ``off`` when absent), optional ``probe``, optional ``mode`` ("generation": token-id parity of 8 greedy tokens, see :func:`_run_generation`).
    """
    started = time.perf_counter()
    record: dict[str, Any] = {"outcome": "fail", "stage": None, "kind": None, "blamed": None, "message": None}
    try:
        if spec.get("probe"):
            with _at("eager"):
                _probe(spec["probe"])
        (_run_generation if spec.get("mode") == "generation" else _run)(spec, record)
        record["outcome"] = "pass"
    except _Failed as failed:
        record.update(stage=failed.stage, message=failed.message, blamed=failed.blamed, kind=classify(failed.message))
        if isinstance(failed.error, MemoryError):
            record["outcome"], record["kind"] = "oom", "out of memory"
    record["seconds"] = round(time.perf_counter() - started, 2)
    return record


def _signal_inputs(model: Any, inputs: dict[str, Any]) -> dict[str, Any] | None:
    """A second input set for the signal check: the sweep's inputs drawn with another seed (same shapes and
    dtypes, other values); an input the other draw shapes differently keeps its first value. None when no
    input changed (nothing was drawn)."""
    import torch

    from .inputs import build_inputs

    other = build_inputs(model, seed=1)
    mixed, changed = {}, False
    for name, value in inputs.items():
        candidate = other.get(name)
        same_kind = (
            isinstance(value, torch.Tensor) and isinstance(candidate, torch.Tensor)
            and candidate.shape == value.shape and candidate.dtype == value.dtype
        )
        mixed[name] = candidate if same_kind else value
        changed = changed or (same_kind and not torch.equal(candidate, value))
    return mixed if changed else None


def check_signal(model: Any, inputs: dict[str, Any], first: list[tuple[str, Any]], record: dict[str, Any]) -> None:
    """Judge eager's outputs by :data:`~.signal_check.RULE` and record the figures (``record["signal"]``).

    Raises:
        _Failed: at stage ``signal``, kind ``degenerate model``, when the outputs carry no signal, or when eager
            refuses the second input set.
    """
    from ..runtime.compare import eager_outputs
    from .signal_check import judge

    with _at("signal"):
        second_inputs = _signal_inputs(model, inputs)
        second = eager_outputs(model, second_inputs) if second_inputs is not None else None
    verdict = judge(first, second)
    record["signal"] = verdict
    if not verdict["ok"]:
        message = verdict["reason"][:600]
        raise _Failed("signal", ValueError(message), message, None)


def _relative(expected: list[tuple[str, Any]], diffs: list[Any]) -> float:
    """The parity check's relative error: max over the compared leaves of (max abs diff / max |eager|) of that
    leaf (a leaf whose eager values are all zero counts 0 when matched exactly, inf otherwise)."""
    from .signal_check import leaf_figures

    worst = 0.0
    for (_, tensor), diff in zip(expected, diffs):
        scale = leaf_figures(tensor)[0]
        value = diff.max_abs_diff / scale if scale > 0 else (0.0 if diff.max_abs_diff == 0 else float("inf"))
        worst = max(worst, value)
    return worst


def _own_names(fixed: list[tuple[str, int, int]], inputs: dict[str, Any]) -> list[tuple[str, int, int]]:
    """The entries of ``fixed`` on the sweep's own inputs (not on inputs upstream's preparation added)."""
    from ..shapes import tensor_leaves

    own = {name for name, _ in tensor_leaves(inputs)}
    return [entry for entry in fixed if entry[0] in own]


def _use_cache_values(config: Any) -> dict[str, Any]:
    """``{config path: use_cache}`` of the config and its sub-configs that have the field (``""`` is the config
    itself, ``text_config`` a sub-config): the cache kind as the job built it, in its record."""
    from transformers import PretrainedConfig

    out: dict[str, Any] = {}
    stack: list[tuple[str, Any]] = [("", config)] if config is not None else []
    seen: set[int] = set()
    while stack:
        path, current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if hasattr(current, "use_cache"):
            value = getattr(current, "use_cache", None)
            out[path] = value if isinstance(value, (bool, type(None))) else str(value)
        stack.extend((f"{path}.{k}" if path else k, v) for k, v in vars(current).items() if isinstance(v, PretrainedConfig))
    return dict(sorted(out.items()))


def _register_outputs(model: Any, inputs: dict[str, Any], engine: str) -> None:
    """Register the model's caches as pytree nodes before eager runs, as the job's engine registers them when it
    exports (no more), so that eager's outputs flatten to the leaves the artifact returns: a returned cache is
    compared tensor by tensor, and judged by the determinism and signal checks too (before, eager's first runs
    saw the cache as one opaque leaf, left out, until the export registered it). Ours:
    :func:`hf_exporters.pytree.register_model_pytrees` on the model and its inputs; upstream: transformers' own
    registration."""
    if engine == "upstream":
        from transformers.exporters.exporter_dynamo import register_cache_pytrees_for_model

        register_cache_pytrees_for_model(model)
        return
    from ..pytree import register_model_pytrees

    register_model_pytrees(model, inputs)


def _run(spec: dict[str, Any], record: dict[str, Any]) -> None:
    import torch

    from ..errors import ExportStageError, ParityError
    from ..pipeline import make_config, make_exporter
    from ..runtime.compare import compare_leaves, eager_outputs, resized_inputs, traced_path_note, ParityReport, _shapes
    from ..shapes import auto_dynamic_shapes, axis_report, clone_tree
    from .inputs import build_inputs

    backend, dynamic, engine = spec["backend"], bool(spec["dynamic"]), spec.get("engine", "ours")
    cache = spec.get("cache", "off")
    if cache not in CACHE_KINDS:
        raise _Failed("tiny config", ValueError(f"cache kind {cache!r}: choose from {', '.join(CACHE_KINDS)}"))
    torch.set_num_threads(int(os.environ.get("HF_EXPORTERS_SWEEP_THREADS", "1")))
    with _at("tiny config"):
        model = build_model(spec["class"], use_cache=None if cache == "default" else False)
        record["parameters"] = sum(p.numel() for p in model.parameters())
        record["use_cache"] = _use_cache_values(getattr(model, "config", None))
    with _at("inputs"):
        inputs = build_inputs(model)
        record["inputs"] = {k: list(v.shape) for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    with _at("eager"):
        _register_outputs(model, inputs, engine)
        first = eager_outputs(model, inputs)
        second = eager_outputs(model, inputs)
        if len(first) != len(second) or any(
            a.shape != b.shape or not torch.equal(a, b) for (_, a), (_, b) in zip(first, second)
        ):
            raise RuntimeError("nondeterministic forward: two eager runs on the same inputs differ (sampling or dropout in forward)")
    check_signal(model, inputs, first, record)

    ours = make_exporter(backend)  # our save / runtime runner serve both engines: the same check
    # what the artifact runs on: the sweep's inputs for ours, as upstream's export prepared them for upstream
    run_inputs = inputs
    if engine == "ours":
        try:
            result = ours.run(model, inputs, make_config(ours, dynamic, None))
        except ExportStageError as error:
            stage = "lowering" if error.stage.startswith(("lowering", "serialisation")) else f"exporter {error.stage}"
            raise _Failed(stage, error, error.detail, error.blamed) from error
        except Exception as error:  # noqa: BLE001
            raise _Failed("exporter", error) from error
        program, ep = result.program, result.exported_program
    else:
        try:
            program, run_inputs = _upstream_export(backend, model, inputs, dynamic)
        except Exception as error:  # noqa: BLE001
            raise _Failed(_upstream_stage(error), error) from error
        ep = _exported_program(program)
        added = sorted(set(run_inputs) - set(inputs))
        if added:
            record["upstream_prepared_inputs"] = added

    def own_part(resized: dict[str, Any] | None) -> dict[str, Any] | None:
        """The sweep's own inputs of a resized set (upstream's precomputed ones are computed again from them)."""
        if resized is None or run_inputs is inputs:
            return resized
        own = {k: resized[k] for k in inputs}
        grown = any(
            isinstance(v, torch.Tensor) and v.shape != inputs[k].shape for k, v in own.items()
        )
        return own if grown else None

    # (eager's inputs, the artifact's inputs) of each input set
    input_sets: list[tuple[dict[str, Any], dict[str, Any]]] = [(inputs, run_inputs)]
    second_expected = None  # eager's outputs on a second input set, computed when it is accepted

    def take_second(second: dict[str, Any] | None) -> Any:
        expected = _take_second_set(model, second, record)
        if expected is None:
            return None
        artifact_inputs = second
        if run_inputs is not inputs:
            try:
                artifact_inputs = upstream_prepared(model, second)
            except Exception as error:  # noqa: BLE001 - upstream cannot take these sizes: one input set
                record["second_input_set"] = f"upstream's preparation refused the resized inputs: {_first_line(error)[:200]}"
                return None
        input_sets.append((second, artifact_inputs))
        return expected

    if dynamic and ep is not None:
        requested = auto_dynamic_shapes(run_inputs)
        pinned, constrained = axis_report(ep, run_inputs, requested)
        fixed = [(a.input, a.axis, a.size) for a in pinned]
        record["static_axes"] = [str(a) for a in pinned]
        if constrained:
            record["constrained_axes"] = [str(a) for a in constrained]
        fixed = _unexpected_static(_own_names(fixed, inputs), inputs)
        # the batch and length axes grow, as for a program without its ExportedProgram (upstream's
        # ONNX): both engines are checked on the same sizes; free sizes on other axes keep theirs
        second_expected = take_second(own_part(resized_inputs(ep, run_inputs, axes=expected_dynamic_axes)))
        if fixed:
            message = "axes asked to be dynamic ended static: " + ", ".join(f"{n}[axis {a}] = {s}" for n, a, s in fixed[:4])
            raise _Failed("exporter dynamic shapes", ValueError(message), f"ValueError: {message}", None)

    if dynamic and ep is None and hasattr(program, "graph") and hasattr(program.graph, "inputs"):
        second, fixed = _onnx_ir_resized(program, run_inputs)
        record["static_axes"] = [f"{n}[axis {a}] = {s}" for n, a, s in fixed]
        fixed = _unexpected_static(_own_names(fixed, inputs), inputs)
        second_expected = take_second(own_part(second))
        if fixed:
            message = "axes asked to be dynamic ended static: " + ", ".join(f"{n}[axis {a}] = {s}" for n, a, s in fixed[:4])
            raise _Failed("exporter dynamic shapes", ValueError(message), f"ValueError: {message}", None)

    with tempfile.TemporaryDirectory(prefix="hf-sweep-") as tmp, _at("runtime"):
        artifact = _save(ours, program, tmp)
        runner = _load_runner(ours, artifact, spec.get("runtime", "python"))
        worst, worst_relative = 0.0, 0.0
        leaf_diffs: dict[str, float] = {}
        for index, (eager_inputs, artifact_inputs) in enumerate(input_sets):
            expected = second_expected if index == 1 else eager_outputs(model, eager_inputs)
            actual = runner(clone_tree(artifact_inputs))
            try:
                diffs = compare_leaves(expected, actual, ours.default_atol)
                report = ParityReport(_shapes(eager_inputs), diffs, ours.default_atol)
            except ParityError as error:
                raise _Failed("parity", error) from error
            worst = max(worst, report.max_abs_diff)
            worst_relative = max(worst_relative, _relative(expected, diffs))
            for diff in diffs:
                leaf_diffs[diff.name] = max(leaf_diffs.get(diff.name, 0.0), float(f"{diff.max_abs_diff:.4g}"))
            record["leaf_diffs"] = dict(leaf_diffs)
            record["max_abs_diff"] = worst
            record["max_rel_diff"] = float(f"{worst_relative:.4g}")
            if not report.ok:
                note = traced_path_note(model, eager_inputs, expected, actual, ours.default_atol)
                if note:  # the model's own code differs between eager and tracing: named before the numbers
                    message = f"ParityError: {note}; {report.describe_failure()}"
                    raise _Failed("parity", ParityError(message), message[:600], None)
                message = f"ParityError: {report.describe_failure()}"
                raise _Failed("parity", ParityError(message), message[:300], None)
        record["atol"] = ours.default_atol
        record["input_sets"] = len(input_sets)


#: new tokens a generation job compares
GENERATION_TOKENS = 8
#: generate() inputs a generation job passes on from the sweep's forward inputs
_GENERATE_INPUTS = ("input_ids", "attention_mask", "input_features", "input_values", "pixel_values")


def _run_generation(spec: dict[str, Any], record: dict[str, Any]) -> None:
    """Generation mode: export the generation parts (:func:`hf_exporters.generation.export_for_generation`),
    write the folder, generate :data:`GENERATION_TOKENS` greedy tokens from it with the backend's runtime
    and compare the ids with eager ``generate()`` on the same inputs (a batch of 2)."""
    import copy

    import torch

    from ..errors import ExportStageError, InputError, ParityError
    from ..generation import ExportedGenerator, export_for_generation
    from ..pipeline import make_config, make_exporter
    from .inputs import build_inputs

    if spec.get("engine", "ours") != "ours":
        raise _Failed("exporter", NotImplementedError("generation mode runs our exporters only"))
    torch.set_num_threads(int(os.environ.get("HF_EXPORTERS_SWEEP_THREADS", "1")))
    with _at("tiny config"):
        model = build_model(spec["class"], use_cache=True)
        record["parameters"] = sum(p.numel() for p in model.parameters())
        if not hasattr(model, "generate"):
            raise TypeError(f"{spec['class']} has no generate()")
    with _at("inputs"):
        inputs = {k: v for k, v in build_inputs(model).items() if k in _GENERATE_INPUTS}
        if not inputs:
            raise InputError("no generate() input (input_ids, input_features, ...) among the sweep's inputs")
        record["inputs"] = {k: list(v.shape) for k, v in inputs.items()}
        generation_config = copy.deepcopy(model.generation_config)
        generation_config.update(max_new_tokens=GENERATION_TOKENS, min_new_tokens=GENERATION_TOKENS, do_sample=False, num_beams=1)
        if getattr(model.config, "is_encoder_decoder", False) and generation_config.decoder_start_token_id is None and generation_config.bos_token_id is None:
            # tiny configs built from defaults may name no start token; eager and exported runs share this one
            generation_config.decoder_start_token_id = generation_config.pad_token_id or 0
            model.generation_config.decoder_start_token_id = generation_config.decoder_start_token_id
    with _at("eager"), torch.no_grad():
        eager = model.generate(**inputs, generation_config=generation_config)
        eager = getattr(eager, "sequences", eager)
    exporter = make_exporter(spec["backend"])
    try:
        artifacts = export_for_generation(exporter, model, inputs, make_config(exporter, True, None))
    except ExportStageError as error:
        stage = "lowering" if error.stage.startswith(("lowering", "serialisation")) else f"exporter {error.stage}"
        raise _Failed(stage, error, error.detail, error.blamed) from error
    except InputError as error:
        raise _Failed("exporter decompose", error) from error
    except Exception as error:  # noqa: BLE001
        raise _Failed("exporter", error) from error
    with tempfile.TemporaryDirectory(prefix="hf-sweep-gen-") as tmp:
        try:
            artifacts.save_pretrained(f"{tmp}/folder")
        except ParityError as error:
            raise _Failed("parity", error) from error
        except Exception as error:  # noqa: BLE001
            raise _Failed("runtime", error) from error
        with _at("runtime"):
            runtime = spec.get("runtime", "python") if spec["backend"] == "executorch" else "python"
            generator = ExportedGenerator.from_pretrained(f"{tmp}/folder", load_preprocessor=False, runtime=runtime)
            ids = generator.generate(**inputs, generation_config=generation_config)
    record["atol"] = exporter.default_atol
    record["new_tokens"] = GENERATION_TOKENS
    if ids.tolist() != eager.tolist():
        same = int((ids == eager).all(dim=0).long().cumprod(0).sum()) if ids.shape == eager.shape else 0
        message = f"ParityError: token ids differ from eager generate() (shapes {list(ids.shape)} vs {list(eager.shape)}; first {same} positions equal)"
        raise _Failed("parity", ParityError(message), message, None)
