"""OnnxExporter Stage 1: torch patches (``register_patch("onnx", "torch....")``), active for the trace
and the lowering."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...registry import register_patch


@register_patch("onnx", "transformers.masking_utils._vmap_expansion_sdpa")
@register_patch("executorch", "transformers.masking_utils._vmap_expansion_sdpa")
def _patch_mask_expansion_by_broadcast(_original: Callable[..., Any]) -> Callable[..., Any]:
    """Build attention masks from broadcast index grids instead of four nested ``torch.vmap`` calls.

    Pattern: ``sdpa_mask`` expands a mask function with ``torch.vmap`` over (batch, head, query, key)
    whenever the model passes an ``or_mask_function``/``and_mask_function`` (sliding windows in
    bidirectional masks, image-token blocks, chunked attention). ``torch.export`` records the vmap as
    ``_add_batch_dim`` nodes; ``ExportedProgram.run_decompositions``, which torch.onnx and
    ``to_edge`` both run, re-traces them outside any vmap level and fails with "Either your tensor may
    have escaped from inside a function being vmapped ... gen_vmap_plumbing" (on ``aten.new_ones``).
    The replacement calls the mask function once on index tensors shaped (B,1,1,1), (1,H,1,1),
    (1,1,Q,1) and (1,1,1,K), which broadcast to the same boolean (B, H, Q, K) mask; every mask
    function in transformers is written in such elementwise index arithmetic and indexing.
    Models: T5Gemma2Model, NemotronAsrStreamingEncoder, UnlimitedOcrModel (onnx static in the sweep).
    Upstream: pytorch/pytorch#153063 (torch.export of ``torch.func.vmap``, open); pre-dispatch export
    records vmap as ``_add_batch_dim``/``_remove_batch_dim`` nodes since pytorch/pytorch#154650, which
    the later re-trace does not replay under a vmap level. The vmap path is transformers' choice in
    ``masking_utils.sdpa_mask(use_vmap=True)``.
    Remove when: ``run_decompositions`` re-traces programs that hold vmapped regions, or transformers
    stops choosing vmap for combined mask functions.
    """

    def expand(mask_function: Callable[..., Any]) -> Callable[..., Any]:
        def full_mask(batch: Any, head: Any, query: Any, key: Any) -> Any:
            grid = (batch.reshape(-1, 1, 1, 1), head.reshape(1, -1, 1, 1), query.reshape(1, 1, -1, 1), key.reshape(1, 1, 1, -1))
            return mask_function(*grid).expand(batch.shape[0], head.shape[0], query.shape[0], key.shape[0])

        return full_mask

    return expand
