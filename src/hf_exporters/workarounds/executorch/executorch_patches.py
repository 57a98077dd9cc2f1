"""ExecuTorch internals that break on valid dynamic-shape graphs: patches of ExecutorchExporter's
Stage 3 (ExecuTorch patches), active during ``to_edge_transform_and_lower`` and ``to_executorch``.

Pattern: XNNPACK's partitioner claiming nodes its serialiser refuses, the edge verifier refusing
Python symbolic-size functions, dim orders decided from strides read from data, and scan loops
emitted with buffers sized at export time.
"""

from __future__ import annotations

from typing import Any

import torch

from ...registry import register_patch
from ...shapes import is_symbolic


def _symbolic_dims(node: torch.fx.Node) -> int:
    """How many axes of ``node``'s output have a symbolic size (a size the trace pinned counts as static)."""
    value = node.meta.get("val")
    shape = getattr(value, "shape", ())
    return sum(is_symbolic(size) for size in shape)


@register_patch("executorch.xnnpack", "executorch.backends.xnnpack.partition.config.gemm_configs.ConvolutionConfig.check_constraints", stage="Stage 3: ExecuTorch patches")
def _patch_xnnpack_conv1d_one_dynamic_axis(original: Any) -> Any:
    """XNNPACK's partitioner claims a 1-D convolution only when its input has at most one symbolic
    axis; one with more (dynamic batch and length) runs on the portable kernel.

    Pattern: a ``Conv1d`` over (batch, channels, length) with batch and length dynamic (the raw-audio
    feature encoders of wav2vec2-style models, convolutional position embeddings). XNNPACK lowers a
    1-D convolution as a 2-D one between an ``unsqueeze`` and a ``squeeze`` (its Conv1dUnsqueezePass),
    and serialises those as static reshapes, which take one dynamic axis: the lowering stopped on
    "XNNPACK reshape only supports 1 dynamic dimension". 2-D convolutions are unaffected.
    Models: UniSpeechSatModel with dynamic shapes; the wav2vec2-style raw-audio encoders share its
    convolutional feature encoder.
    Upstream: executorch backends/xnnpack/partition/config/gemm_configs.py (``ConvolutionConfig``
        does not check what ``_passes/conv1d_unsqueeze_pass.py`` and ``operators/op_squeeze.py`` need)
    Remove when: the XNNPACK convolution config refuses such 1-D convolutions, or XNNPACK's
        reshape takes more than one dynamic axis.
    """

    def check_constraints(self: Any, node: torch.fx.Node, ep: Any) -> bool:
        stride = node.args[3] if len(node.args) > 3 else ()
        if len(stride) == 1 and _symbolic_dims(node.args[0]) > 1:
            return False
        return original(self, node, ep)

    return check_constraints


@register_patch(
    "executorch.xnnpack",
    "executorch.backends.xnnpack.partition.config.generic_node_configs.UnsqueezeCopyConfig.check_constraints",
    stage="Stage 3: ExecuTorch patches",
)
def _patch_xnnpack_unsqueeze_one_dynamic_axis(original: Any) -> Any:
    """XNNPACK's partitioner claims an ``unsqueeze_copy`` only when its output has at most one symbolic
    axis; one with more runs on the portable kernel.

    Pattern: a trailing ``unsqueeze`` of a (batch, length, ...) tensor with both axes dynamic
    (``attn_output * gate.unsqueeze(-1).sigmoid()``, masks widened for broadcasting). The partitioner's
    check looks at the axis only, so XNNPACK claims the node, and serialisation then refuses it: XNNPACK
    lowers it as a static reshape, which takes one dynamic axis ("XNNPACK reshape only supports 1
    dynamic dimension"). The view-copy config already refuses such reshapes; this gives unsqueeze the
    same rule.
    Models: Step3p7Model with dynamic shapes (its gated attention output).
    Upstream: executorch backends/xnnpack/partition/config/generic_node_configs.py
        (``UnsqueezeCopyConfig.check_constraints`` does not mirror the serializer's dynamic-axis check
        in ``operators/op_squeeze.py``)
    Remove when: the XNNPACK unsqueeze config refuses outputs with more than one symbolic axis.
    """

    def check_constraints(self: Any, node: torch.fx.Node, ep: Any) -> bool:
        if _symbolic_dims(node) > 1:
            return False
        return original(self, node, ep)

    return check_constraints


@register_patch("executorch", "executorch.exir.verification.verifier._EXECUTORCH_SYM_OPS", stage="Stage 3: ExecuTorch patches")
def _patch_edge_verifier_python_sym_ops(original: Any) -> Any:
    """The edge-dialect verifier accepts the Python symbolic-size functions (``torch.sym_min``,
    ``torch.sym_max``, ``torch.sym_ite``, ...) that ``to_executorch`` maps to ExecuTorch's prim ops.

    Pattern: ``min(a, b)`` or ``max(a, b)`` over sizes read from data (unbacked SymInts) is recorded
    as a ``torch.sym_min``/``torch.sym_max`` node. ``to_edge`` verifies the edge program before
    ``to_executorch`` replaces those nodes by ``executorch_prim::sym_min.Scalar`` and its kin
    (``exir/passes/executorch_prim_ops_registry.py``, which the runtime implements), and its verifier
    lets through only builtins and those prim ops, not the Python functions: the lowering stopped on a
    bare ``AssertionError`` (``assert op.__name__ in ("alloc",)``). The verifier's set of symbolic ops
    gains the Python functions that have such a mapping, nothing else.
    Models: Glm5NextModel, Glm5NextTextModel (which then stop on sizes read from data in the
    lowering's dim-order pass: "Could not guard on data-dependent expression 16*u22 < 16").
    Upstream: executorch exir/verification/verifier.py (``check_valid_edge_op`` refuses the Python sym
        functions that exir/passes/executorch_prim_ops_registry.py maps)
    Remove when: the edge verifier accepts ``torch.sym_min``/``torch.sym_max`` (or to_edge maps them first).
    """
    from executorch.exir.passes.executorch_prim_ops_registry import _PYTHON_SYM_OPS_TO_EXECUTORCH_SYM_OPS

    python_functions = {op for op in _PYTHON_SYM_OPS_TO_EXECUTORCH_SYM_OPS if getattr(op, "__module__", "").startswith("torch")}
    return set(original) | python_functions


def _stride_order(a: Any, b: Any) -> int | None:
    """-1 when stride ``a`` sorts inside ``b`` (known smaller, or ``b`` a multiple of it), 1 when outside,
    0 when equal, None when not known. Both strides are at least 1, so a multiple is at least as large,
    and two strides each a multiple of the other are equal: that catches ``256*Max(1, c) == 256`` where
    the range of ``c`` makes ``Max(1, c)`` 1, which torch proves by divisibility but not directly.
    Equal strides belong to a size-1 axis, which may sit on either side: the sort keeps such axes in
    their row-major order."""
    from torch.fx.experimental.symbolic_shapes import guard_or_false

    a_divides_b, b_divides_a = guard_or_false(b % a == 0), guard_or_false(a % b == 0)
    if guard_or_false(a == b) or (a_divides_b and b_divides_a):
        return 0
    if guard_or_false(a < b) or a_divides_b:
        return -1
    if guard_or_false(b < a) or b_divides_a:
        return 1
    return None


@register_patch(
    "executorch",
    "executorch.exir.tensor.dim_order_from_stride",
    "executorch.exir.tensor_layout.dim_order_from_stride",
    "executorch.exir.emit._emitter.dim_order_from_stride",
    "executorch.exir.passes.replace_view_copy_with_view_pass.dim_order_from_stride",
    stage="Stage 3: ExecuTorch patches",
)
def _patch_dim_order_from_positive_strides(original: Any) -> Any:
    """The dim order of a tensor whose strides are sizes read from data (unbacked SymInts), decided
    from what every stride is: at least 1, and a multiple of the strides of the axes inside it.

    Pattern: an intermediate of shape ``(h, w, c)`` with ``h, w = grid.tolist()`` (a vision tower
    reading each image's patch grid, a codec's frame count), strides ``(w*c, c, 1)`` or ``(4*u, 4, 1)``.
    ``to_executorch`` computes every tensor's dim order by sorting its strides, and the comparison of an
    unbacked stride with 1 or with a fixed stride (``4*u58 < 4``) cannot be decided: ExecuTorch only
    refuses a stride of 0, so ``u58`` might be 0 or negative for torch's reasoning, and the lowering
    stopped on "GuardOnDataDependentSymNode: Could not guard on data-dependent expression 4*u58 < 4"
    (or ``u88*u89 < u89``). Strides of ExecuTorch tensors are positive, so each symbolic stride gets
    ``torch._check(stride >= 1)`` (no runtime check: ExecuTorch computes strides from sizes), and a
    stride that is a multiple of another sorts outside it. Two strides each a multiple of the other are
    equal and keep their row-major order: Mamba2's chunked scan in a dynamic prefill has strides
    ``(1024*Max(1, c), 256*Max(1, c), 256, 1)`` with ``c`` the chunk count, 1 over the whole length range;
    taking the divisibility for "inside" labelled that contiguous tensor (0, 2, 1, 3), and the portable
    kernels, which take only contiguous or channels-last dim orders, stopped at run time ("2 input
    tensors have different dim orders; [op_cumsum.cpp:103]"). An order still undecided goes to the
    original (its error). Static strides go to the original unchanged.
    Models: Siglip2Model, Siglip2VisionModel, Sam3Model, Sam3LiteTextModel, VJEPA2Model, MimiDecoderModel,
    PocketTTSAudioTokenizerDecoderModel, Glm5NextModel, Glm5NextTextModel (executorch in the sweep);
    the Mamba2 family's generation (BambaForCausalLM, GraniteMoeHybridForCausalLM).
    Upstream: executorch exir/tensor.py ``dim_order_from_stride`` (its ``K.__lt__`` handles ``u0 < 2*u0``
        and ``1 < u0`` but not ``u0 < 1`` or ``k*u0 < k``; no report found)
    Remove when: ``dim_order_from_stride`` assumes positive strides.
    """
    import functools

    def dim_order_from_stride(stride: Any) -> Any:
        symbolic = [s for s in stride if isinstance(s, torch.SymInt)]
        if not symbolic or any(not isinstance(s, torch.SymInt) and s == 0 for s in stride):
            return original(stride)  # static strides, or a 0 stride: ExecuTorch's own answer or error
        for size in symbolic:
            torch._check(size >= 1, lambda: "0 in strides is not supported for ExecuTorch.")
        order = sorted(range(len(stride)), key=functools.cmp_to_key(lambda i, j: _stride_order(stride[i], stride[j]) or 0), reverse=True)
        for outer, inner in zip(order, order[1:]):
            if _stride_order(stride[outer], stride[inner]) is None:
                return original(stride)  # not decided: the original's answer, or its error
        return tuple(order)

    return dim_order_from_stride


@register_patch("executorch", "executorch.exir.emit._emitter._Emitter._emit_scan", stage="Stage 3: ExecuTorch patches")
def _patch_scan_buffers_sized_at_run_time(original: Any) -> Any:
    """The emitted scan loop sizes its buffers at run time: each carry buffer takes the initial carry's
    shape (``clone.out`` before the loop), and at the first step each stacked-output buffer takes the
    shape ``(1, *step_output)`` (``unsqueeze_copy.out``) before ``et_copy_index`` fills it.

    Pattern: ``torch.ops.higher_order.scan`` with a symbolic size in its carry or per-step outputs (a
    recurrent state of shape (batch, ...) in a dynamic export: Mamba's selective scan, RecurrentGemma's
    RG-LRU and RWKV's attention as scans, see ``_linear_recurrence``). ExecuTorch emits the scan as a
    loop over buffers planned at their upper-bound shapes. It fills the carry buffers with
    ``aten::copy_``, which only broadcasts into the buffer's current (upper-bound) shape, so every call
    stopped in the runtime, at the example's sizes too ("[op_copy.cpp:83] Check failed
    (tensor_is_broadcastable_to(src, in))"). ``et_copy_index`` then requires the stacked buffer's
    trailing axes to equal the step output's and only grows the leading axis ("[et_copy_index.cpp:107]
    Mismatch in shape between copy_to and copy_from tensors"). The carry copies go before the original
    emission (its jump targets are counted after them); the first-step block (``eq``, a jump past it
    on later steps, one ``unsqueeze_copy`` per stacked output) goes inside the loop right before the
    ``et_copy_index`` calls, after the loop's jump target, so no target moves.
    Models: MambaForCausalLM, FalconMambaForCausalLM, ZambaForCausalLM generation (their prefill's
    scan) on executorch; any dynamic export of a scan with symbolic sizes.
    Upstream: executorch exir/emit/_emitter.py (``_emit_scan`` initialises carry_outputs with
        ``aten::copy_`` and leaves the stacked outputs at their planned shape) with
        kernels/prim_ops/et_copy_index.cpp (checks the trailing axes at every index); no report found
    Remove when: the scan emitter sizes its carry and output buffers at run time.
    """
    from executorch.exir.schema import Bool, EValue, Instruction, Int, JumpFalseCall, KernelCall, Null

    def _emit_scan(self: Any, args: Any, outputs: Any) -> Any:
        init = args[1]
        outputs = list(outputs)
        clone_index, _ = self._get_operator(name="aten::clone", overload="out")
        no_format = self._emit_evalue(EValue(Null())).id
        for initial, buffer in zip(init, outputs[: len(init)]):
            call = KernelCall(op_index=clone_index, args=[initial.id, no_format, buffer.id, buffer.id])
            self.chain.instructions.append(Instruction(call))
        start = len(self.chain.instructions)
        result = original(self, args, outputs)
        stacked = {value.id for value in outputs[len(init):]}
        copy_index_op, _ = self._get_operator(name="executorch_prim::et_copy_index", overload="tensor")
        fills = [
            (position, instruction.instr_args)
            for position, instruction in enumerate(self.chain.instructions[start:], start)
            if isinstance(instruction.instr_args, KernelCall)
            and instruction.instr_args.op_index == copy_index_op
            and instruction.instr_args.args[0] in stacked
        ]
        if not fills:
            return result
        first = fills[0][0]
        step = fills[0][1].args[2]  # the loop's iteration index
        eq_index, _ = self._get_operator(name="executorch_prim::eq", overload="Scalar")
        unsqueeze_index, _ = self._get_operator(name="aten::unsqueeze_copy", overload="out")
        zero = self._emit_evalue(EValue(Int(0))).id
        is_first = self._emit_evalue(EValue(Bool(False))).id
        block = [Instruction(KernelCall(op_index=eq_index, args=[step, zero, is_first]))]
        after = self.instruction_start_offset + first + 2 + len(fills)
        block.append(Instruction(JumpFalseCall(cond_value_index=is_first, destination_instruction=after)))
        for _, call in fills:
            buffer, step_output = call.args[0], call.args[1]
            block.append(Instruction(KernelCall(op_index=unsqueeze_index, args=[step_output, zero, buffer, buffer])))
        self.chain.instructions[first:first] = block
        return result

    return _emit_scan
