"""Views that a decomposition's output layout no longer allows: a patch of ExecutorchExporter's Stage 3
(ExecuTorch patches), active from Stage 3 until the program is serialised (the lowering's decompositions).

Pattern: the trace records ``aten.view`` where a ``view``/``reshape`` met a tensor whose strides allowed it. The
lowering re-traces the program (``run_decompositions``) with fake tensors, and a decomposed operator may then
produce another layout than the operator it replaces: ``layer_norm`` decomposed into elementwise operations
keeps its input's (transposed) strides where the fused kernel returned a contiguous tensor. A ``view`` of that
output is then refused, and the lowering stops with "Cannot view a tensor with shape ... and strides ...".
"""

from __future__ import annotations

from typing import Any

import torch

from ...registry import register_patch

_STAGE = "Stage 3: ExecuTorch patches"


def _written_through(node: torch.fx.Node) -> bool:
    """Whether an operator writes in place into ``node``'s value, directly or through further views of it."""
    for user in node.users:
        schema = getattr(user.target, "_schema", None)
        if schema is None:
            continue
        if schema.is_mutable:
            return True
        if any(ret.alias_info is not None for ret in schema.returns) and _written_through(user):
            return True
    return False


def views_as_reshapes(graph_module: torch.fx.GraphModule) -> int:
    """Turn every ``aten.view.default`` of ``graph_module`` and its nested graphs into ``aten.reshape.default``,
    except a view something writes through in place (a reshape may be a copy); returns how many. A graph that
    changed is recompiled."""
    changed = 0
    for module in graph_module.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        count = 0
        for node in module.graph.nodes:
            if node.op == "call_function" and node.target is torch.ops.aten.view.default and not _written_through(node):
                node.target = torch.ops.aten.reshape.default
                count += 1
        if count:
            module.recompile()
            changed += count
    return changed


@register_patch("executorch", "torch.export.exported_program.ExportedProgram.run_decompositions", stage=_STAGE)
def _patch_views_reshaped_before_decomposition(original: Any) -> Any:
    """Each ``run_decompositions`` of the lowering first turns the program's ``view`` calls into ``reshape``.

    Pattern: a ``view`` of a tensor whose layout a decomposition changes (see the module). ``reshape`` is
    decomposed in the same re-trace, against the strides that re-trace computes: into the same ``view`` where
    they allow it, so a program that lowered before lowers to the same operators, and into a copy and a view
    where they do not. A view that an in-place operator writes through (before the lowering's first call, which
    functionalises the program) stays a view: a copy would drop the write. The rewrite is made in the program
    the lowering is given, the exporter result's ``exported_program`` included (the same computation).
    Models: GPT2LMHeadModel generation (prefill and decode with dynamic batch and length: the position
    embeddings' add decomposes into a sequence-major layout), GraniteDoclingVisionModel (its connector's
    LayerNorm over a transposed residual, then ``pixel_shuffle``'s views).
    Upstream: pytorch/pytorch#141107 (decompositions whose fake-tensor strides differ from the traced
        operator's, which breaks a recorded ``view``; torch.onnx meets it too: ``_fix_view_as_reshape``)
    Remove when: decompositions keep the strides of the operator they replace, or ``run_decompositions`` records
        layout-independent reshapes.
    """

    def run_decompositions(self: Any, *args: Any, **kwargs: Any) -> Any:
        views_as_reshapes(self.graph_module)
        return original(self, *args, **kwargs)

    return run_decompositions
