"""XNNPACK partitions whose output list names one value twice, or names one of the partition's inputs.

XNNPACK's ``preprocess`` numbers a partition's external values: its inputs, then its outputs. A value that is
already numbered cannot be an output again, so a partition that returns one value at two output positions (or
returns an input unchanged) stops the lowering with "Output node '...' is already in the inputs".
"""

from __future__ import annotations

from typing import Any

import torch

from ...registry import register_patch


def copy_repeated_outputs(graph_module: torch.fx.GraphModule) -> list[str]:
    """Give every output position of ``graph_module`` its own value: an output that is a placeholder, or a value
    an earlier position already returns, becomes a copy of it (``aten.clone``, which XNNPACK runs as ``copy``).

    Returns:
        the names of the values copied, one per copy, in output order (empty when every output is distinct).
    """
    from executorch.exir.dialects._ops import ops as exir_ops

    graph = graph_module.graph
    output = next(node for node in reversed(graph.nodes) if node.op == "output")
    values = output.args[0]
    if not isinstance(values, (list, tuple)):
        return []
    seen: set[torch.fx.Node] = {node for node in graph.nodes if node.op == "placeholder"}
    copied: list[str] = []
    distinct: list[Any] = []
    for value in values:
        if isinstance(value, torch.fx.Node) and value in seen:
            with graph.inserting_before(output):
                copy = graph.call_function(exir_ops.edge.aten.clone.default, (value,))
            copy.meta = {key: item for key, item in value.meta.items() if key in ("val", "tensor_meta", "stack_trace")}
            copied.append(value.name)
            value = copy
        if isinstance(value, torch.fx.Node):
            seen.add(value)
        distinct.append(value)
    if copied:
        output.args = (type(values)(distinct),)
        graph_module.recompile()
    return copied


@register_patch(
    "executorch.xnnpack",
    "executorch.backends.xnnpack.xnnpack_preprocess.generate_node_to_external_map",
    stage="Stage 3: ExecuTorch patches",
)
def _patch_xnnpack_repeated_partition_outputs(original: Any) -> Any:
    """Before XNNPACK numbers a partition's external values, an output position that repeats another's value or
    returns an input unchanged gets a copy of it (:func:`copy_repeated_outputs`), so that every output is a value
    of its own; the runtime fills each position as before.

    Pattern: a model output computed at the end of a partition reaches two program outputs, or one output and
    a second use outside the partition that the partition creation then folds into the same value: PeAudioEncoder
    (``last_hidden_state = h[:, 1:]``, ``pooler_output = h[:, 0]``: after XNNPACK's passes both are the same
    ``permute``), ClvpModelForConditionalGeneration and DeepseekV4Model. The lowering stopped with "Output node
    'aten_permute_copy_default_1' is already in the inputs. This is likely due to pass through arguments, which are
    not supported in XNNPACK Delegate."
    Models: PeAudioEncoder, ClvpModelForConditionalGeneration, DeepseekV4Model (executorch static in the sweep).
    Upstream: executorch backends/xnnpack/xnnpack_preprocess.py (``generate_node_to_external_map`` refuses a value
        that is already external instead of defining a copy); no report found
    Remove when: XNNPACK's preprocess gives a repeated or passed-through output a copy (or the partitioner keeps
        such outputs outside the partition).
    """

    def numbered(exported_program: Any, graph_module: torch.fx.GraphModule) -> Any:
        copy_repeated_outputs(graph_module)
        return original(exported_program, graph_module)

    return numbered
