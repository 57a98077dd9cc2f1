"""OnnxExporter Stage 4: ONNX translations (``register_onnx_translation("aten::op.overload")``),
passed to torch.onnx as its custom translation table.

Each function is traced by torch.onnx with onnxscript ops (``op.X`` builds a node); Python ``if``s on
attributes and static ranks are resolved while the graph is built.
"""

from __future__ import annotations

from typing import Optional

import onnx_ir as ir
from onnxscript import opset18 as op
from onnxscript.onnx_types import INT64, TensorType

from ... import registry
from .._erfinv import ERFINV_CENTRAL, ERFINV_TAIL


def _grouped_rows_matmul(rows: TensorType, weight: TensorType, offs: TensorType) -> TensorType:
    """``out[r] = rows[r] @ weight[e(r)]`` where ``e(r)`` is the group of row ``r`` given by the
    cumulative group ends ``offs`` (rows sorted by group). Rows past ``offs[-1]`` are zero, as in eager.

    Computed densely (every row times every group's weight, then the row's group picked), which is
    ``E`` times the work of the ragged product but needs no loop or data-dependent shape.
    """
    offs64 = op.Cast(offs, to=INT64.dtype)
    num_rows = op.Shape(rows, start=0, end=1)  # [S]
    row_ids = op.Range(op.Constant(value_int=0), op.Squeeze(num_rows), op.Constant(value_int=1))  # [S]
    # group of each row: how many group ends lie at or before it
    ends_passed = op.LessOrEqual(op.Unsqueeze(offs64, op.Constant(value_ints=[0])), op.Unsqueeze(row_ids, op.Constant(value_ints=[1])))
    group = op.ReduceSum(op.Cast(ends_passed, to=INT64.dtype), op.Constant(value_ints=[1]), keepdims=0)  # [S]
    num_groups = op.Shape(weight, start=0, end=1)
    in_range = op.Less(group, num_groups)
    group = op.Min(group, op.Sub(num_groups, op.Constant(value_ints=[1])))
    every_group = op.MatMul(rows, weight)  # [E, S, out]
    every_group = op.Transpose(every_group, perm=[1, 0, 2])  # [S, E, out]
    out_dim = op.Shape(weight, start=2, end=3)
    index = op.Expand(op.Reshape(group, op.Constant(value_ints=[-1, 1, 1])), op.Concat(num_rows, op.Constant(value_ints=[1]), out_dim, axis=0))
    picked = op.Squeeze(op.GatherElements(every_group, index, axis=1), op.Constant(value_ints=[1]))  # [S, out]
    zero = op.CastLike(op.Constant(value_float=0.0), picked)
    return op.Where(op.Unsqueeze(in_range, op.Constant(value_ints=[1])), picked, zero)


@registry.register_onnx_translation("transformers::grouped_mm_fallback.default")
def _aten_grouped_mm_fallback(input: TensorType, weight: TensorType, offs: TensorType) -> TensorType:
    """Grouped matmul of expert-sorted tokens (transformers' MoE ``grouped_mm`` experts on CPU/float32).

    Pattern: ``transformers::grouped_mm_fallback(input [S, in], weight [E, in, out], offs [E])``, the
    custom op transformers' ``grouped_mm`` experts implementation calls when ``torch._grouped_mm``
    cannot run; torch.onnx has no translation for it ("No ONNX function found for
    transformers.grouped_mm_fallback").
    Models: MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM and every MoE model using
    transformers.integrations.moe grouped_mm experts.
    Remove when: transformers or onnxscript ship an ONNX translation of the op (none in onnxscript 0.7.2).
    Upstream: model-side (transformers.integrations.moe registers the custom op without an ONNX translation)
    """
    return _grouped_rows_matmul(input, weight, offs)


@registry.register_onnx_translation("aten::_grouped_mm.default")
def _aten_grouped_mm(
    self: TensorType,
    mat2: TensorType,
    offs: Optional[TensorType] = None,
    bias: Optional[TensorType] = None,
    out_dtype: int = -1,
) -> TensorType:
    """``aten._grouped_mm`` with offsets (ragged MoE groups).

    Pattern: ``torch._grouped_mm(tokens [S, in], weights [E, in, out], offs=[E])``, which transformers'
    ``grouped_mm`` experts use when the weights are bfloat16; onnxscript's translation raises
    "Grouped matmul with offsets (ragged/MoE) is not supported".
    Models: MixtralForCausalLM, Qwen3MoeForCausalLM (bfloat16 grouped_mm experts).
    Remove when: onnxscript's aten_grouped_mm supports ``offs`` (not in 0.7.2).
    Upstream: https://github.com/microsoft/onnxscript/blob/v0.7.2/onnxscript/function_libs/torch_lib/ops/core.py (aten_grouped_mm raises NotImplementedError for offs)
    """
    if offs is None:
        result = op.MatMul(self, mat2)
    else:
        result = _grouped_rows_matmul(op.CastLike(self, mat2), mat2, offs)
    if bias is not None:
        result = op.Add(result, bias)
    if out_dtype is not None and out_dtype != -1:
        result = op.Cast(result, to=out_dtype)
    return result


@registry.register_onnx_translation("aten::sym_numel.default")
def _aten_sym_numel(self: TensorType) -> INT64:
    """``tensor.numel()`` of a tensor whose size is symbolic: a 0-d INT64, the product of its shape.

    Pattern: ``x.numel()`` on a tensor whose length was read from data (a ``repeat_interleave`` by
    image grid sizes in the vision towers' position-embedding interpolation,
    ``get_vision_interpolation_indices_and_weights``) stays in the program as ``aten.sym_numel``,
    which torchlib does not translate ("No ONNX function found for aten.sym_numel.default"); it has
    ``sym_size`` only.
    Models: Qwen3VLVisionModel, Qwen3_5VisionModel, CohereCompassVisionModel (onnx static in the sweep).
    Upstream: onnxscript torchlib (``aten_sym_size`` but no ``aten_sym_numel`` in onnxscript 0.7.2; no
        report found)
    Remove when: torchlib translates ``aten::sym_numel``.
    """
    return op.ReduceProd(op.Shape(self), keepdims=0)


@registry.register_onnx_translation("_operator::floordiv")
def _aten_sym_floordiv(self: INT64, other: INT64) -> INT64:
    """``a // b`` of two sizes (Python floor division of SymInts), rounded down for negative values too.

    Pattern: size arithmetic such as ``-((kernel - length) // stride)`` (a ceil division written as a
    negated floor division) stays in a dynamic program as ``operator.floordiv``; torchlib translates
    it to ONNX ``Div``, which truncates toward zero, so a negative numerator gives a size one larger
    than eager's (one frame where eager has two). The quotient is corrected by one where the signs
    differ and the remainder is not zero, as ``torch.floor_divide`` on integers does.
    Models: any dynamic program that floor-divides a negative size expression; found on
        MimiEncoderModel (onnx dynamic) with a first version of the Mimi padding patch, which now
        divides with a non-negative numerator.
    Upstream: microsoft/onnxscript#2342 (``_operator::floordiv`` is implemented for non-negative inputs only)
    Remove when: torchlib's ``operator_floordiv`` rounds down for negative inputs.
    """
    zero = op.Constant(value_int=0)
    differ = op.Equal(op.Less(self, zero), op.Greater(other, zero))
    inexact = op.Not(op.Equal(op.Mod(self, other), zero))
    return op.Sub(op.Div(self, other), op.Cast(op.And(differ, inexact), to=INT64.dtype))


def _polynomial(w: TensorType, coefficients: tuple[float, ...]) -> TensorType:
    result = op.CastLike(op.Constant(value_float=coefficients[0]), w)
    for c in coefficients[1:]:
        result = op.Add(op.Mul(result, w), op.CastLike(op.Constant(value_float=c), w))
    return result


@registry.register_onnx_translation("prims::erf_inv.default")
def _aten_erf_inv(self: TensorType) -> TensorType:
    """``torch.erfinv`` (decomposed to ``prims.erf_inv``): ONNX has no inverse error function.

    Pattern: a normal quantile ``Normal(0, 1).icdf(p) = sqrt(2) * erfinv(2p - 1)``, which Gemma 3n's
    activation sparsity computes from its target sparsity in forward; torchlib has no translation
    ("No ONNX function found for prims.erf_inv.default"). Computed with Giles' single-precision
    approximation (two polynomials in w = -log(1 - x^2), relative error about 4e-7: float32-grade
    in every dtype, float64 included); ±1 give ±inf and |x| > 1 gives NaN, as torch does.
    Models: Gemma3nTextModel, Gemma3nForCausalLM (onnx in the sweep).
    Upstream: onnxscript torchlib (no ``erfinv`` / ``prims.erf_inv`` translation in onnxscript 0.7.2);
        the ONNX operator set has no Erfinv
    Remove when: torchlib translates ``aten::erfinv``.
    """
    one = op.CastLike(op.Constant(value_float=1.0), self)
    w = op.Neg(op.Log(op.Mul(op.Sub(one, self), op.Add(one, self))))
    central = _polynomial(op.Sub(w, op.CastLike(op.Constant(value_float=2.5), self)), ERFINV_CENTRAL)
    tail = _polynomial(op.Sub(op.Sqrt(w), op.CastLike(op.Constant(value_float=3.0), self)), ERFINV_TAIL)
    p = op.Where(op.Less(w, op.CastLike(op.Constant(value_float=5.0), self)), central, tail)
    result = op.Mul(p, self)
    infinity = op.Mul(op.Sign(self), op.CastLike(op.Constant(value_float=float("inf")), self))
    return op.Where(op.Equal(op.Abs(self), one), infinity, result)


@registry.register_onnx_translation("aten::repeat_interleave.self_int")
def _aten_repeat_interleave_symbolic_repeats(
    self: TensorType, repeats: INT64, dim: Optional[int] = None, output_size: Optional[int] = None
) -> TensorType:
    """``x.repeat_interleave(n, dim)`` with one count ``n`` for every slice, ``n`` an int or a size read
    from another input (a SymInt).

    Pattern: ``qformer_input_ids.repeat_interleave(frames, dim=0)`` with ``frames = pixel_values.shape[1]``
    dynamic. torchlib's symbolic-count branch places ``n`` at axis ``dim`` of the broadcast shape
    instead of the axis after it (its int branch places it right), so the program neither repeats nor
    interleaves: onnxruntime gives ``batch`` rows instead of ``batch * n`` when ``batch == n`` (a later
    Concat fails "Non concat axis dimensions must match"), or fails the Expand otherwise.
    Each slice along ``dim`` is unsqueezed, expanded ``n`` times on the new axis and the two axes merged,
    the same in both cases. ``dim=None`` flattens first, as torch does. Output: ``self.shape`` with axis
    ``dim`` ``n`` times as long.
    Models: InstructBlipVideoModel, InstructBlipVideoForConditionalGeneration (dynamic frames).
    Upstream: onnxscript torchlib ``aten_repeat_interleave_self_int``, symbolic branch of
        https://github.com/microsoft/onnxscript/pull/2548 (still in onnxscript 0.7.2; no report found)
    Remove when: torchlib's symbolic branch puts the count at ``dim + 1``.
    """
    rank = len(self.shape)
    if dim is None:
        self = op.Reshape(self, op.Constant(value_ints=[-1]))
        dim, rank = 0, 1
    axis = dim % rank
    ones_before = op.Constant(value_ints=[1] * (axis + 1))
    ones_after = op.Constant(value_ints=[1] * (rank - axis - 1))
    count = op.Constant(value_ints=[repeats]) if isinstance(repeats, int) else op.Reshape(op.Cast(repeats, to=INT64.dtype), op.Constant(value_ints=[-1]))
    broadcast = op.Concat(ones_before, count, ones_after, axis=0) if rank - axis - 1 else op.Concat(ones_before, count, axis=0)
    expanded = op.Expand(op.Unsqueeze(self, op.Constant(value_ints=[axis + 1])), broadcast)
    shape = op.Shape(self)
    merged = [op.Constant(value_ints=[-1])]
    if axis:
        merged.insert(0, op.Slice(shape, op.Constant(value_ints=[0]), op.Constant(value_ints=[axis])))
    if rank - axis - 1:
        merged.append(op.Slice(shape, op.Constant(value_ints=[axis + 1]), op.Constant(value_ints=[rank])))
    return op.Reshape(expanded, op.Concat(*merged, axis=0) if len(merged) > 1 else merged[0])


@registry.register_onnx_translation("aten::remainder.Scalar")
def _aten_remainder_symbolic_scalar(self: TensorType, other: TensorType) -> TensorType:
    """``x % n`` for a tensor ``x`` and a scalar ``n`` that may be a size read from the data (a SymInt).

    Pattern: ``positions % window`` with ``window = lengths.max().item() * k`` (the audio encoders'
    attention windows). The program keeps ``aten.remainder.Scalar`` with the symbolic scalar as its
    second argument; torchlib builds a constant from it ("int() argument must be a string, a bytes-like
    object or a real number, not 'SymbolicTensor'"). Here a symbolic ``n`` is cast to ``x``'s type and
    a Python number becomes a constant. Integers: ONNX ``Mod`` with ``fmod=0`` (the sign follows the
    divisor, as torch's remainder); floating point: as torch's kernel, ``fmod(x, n)`` plus ``n`` where that
    is non-zero and of the other sign than ``n`` (a Python ``n`` becomes a constant of ``x``'s type). Output:
    ``x``'s shape and type.
    Models: Qwen3ASREncoder (onnx in the sweep).
    Upstream: onnxscript torchlib ``aten_remainder_scalar`` (``ir.tensor(other)`` on a symbolic value,
        onnxscript 0.7.2; no report found)
    Remove when: torchlib accepts a symbolic scalar in ``aten::remainder.Scalar``.
    """
    if isinstance(other, (int, float)):
        divisor = op.Constant(value=ir.tensor(other, dtype=self.dtype))  # in x's type, no float32 rounding
    else:
        divisor = op.CastLike(other, self)
    if self.dtype.is_integer():
        return op.Mod(self, divisor, fmod=0)
    # torch's kernel: fmod, then plus n where the remainder is non-zero and its sign differs from n's
    rest = op.Mod(self, divisor, fmod=1)
    zero = op.CastLike(op.Constant(value_float=0.0), self)
    differs = op.And(op.Not(op.Equal(rest, zero)), op.Xor(op.Less(rest, zero), op.Less(divisor, zero)))
    return op.Where(differs, op.Add(rest, divisor), rest)


def _integer_power(base: TensorType, exponent: TensorType, bits: int) -> TensorType:
    """``base ** exponent`` for integer tensors by repeated squaring over the ``bits`` low bits of the
    exponent: only ``Mul``, which wraps around on overflow as torch's integer kernels do. Shapes
    broadcast; the result has ``base``'s type."""
    one = op.CastLike(op.Constant(value_int=1), exponent)
    two = op.CastLike(op.Constant(value_int=2), exponent)
    result = op.Expand(op.CastLike(op.Constant(value_int=1), base), op.Shape(op.Add(op.CastLike(base, exponent), exponent)))
    for _ in range(bits):
        result = op.Where(op.Equal(op.BitwiseAnd(exponent, one), one), op.Mul(result, base), result)
        base = op.Mul(base, base)
        exponent = op.Div(exponent, two)
    return result


def _value_bits(dtype: ir.DataType) -> int:
    """Bits that a non-negative value of the integer ``dtype`` can use (63 for int64, 8 for uint8)."""
    bits = int(dtype.itemsize * 8)
    return bits if dtype.name.startswith("UINT") else bits - 1


@registry.register_onnx_translation("aten::pow.Tensor_Tensor", "aten::pow.Tensor_Scalar", "_operator::pow")
def _aten_pow_integer_exact(self: TensorType, exponent: TensorType) -> TensorType:
    """``x ** n`` exact for integer tensors (wrapping around on overflow, as torch).

    Pattern: BLT's rolling polynomial hash, ``torch.tensor(prime) ** torch.arange(n)`` in int64;
    torchlib emits ONNX ``Pow``, which onnxruntime computes through float64 for int64: past 2**53 the
    low bits are lost and past 2**63 it saturates (1000000007**5 gives -2**63 where torch gives
    7232439895113528231), so hashes and the embeddings they index differ. Integer operands: repeated
    squaring with ``Mul`` over the exponent's bits (63 steps for int64; for a Python int exponent,
    such as ``size ** 2`` on a SymInt, over its own bits; negative exponents, which torch rejects for
    integers, are left to ``Pow``). Floating point operands: ``Pow``, as torchlib.
    Output: the broadcast shape, ``x``'s type.
    Models: BltModel and BltForCausalLM (onnx parity).
    Upstream: onnxscript torchlib ``aten_pow`` (plain ``Pow``); onnxruntime's integer ``Pow`` kernel
        (``std::pow`` in double); no report found
    Remove when: onnxruntime's integer ``Pow`` is exact and wraps, or torchlib lowers integer
        powers without ``Pow``.
    """
    def integral(value: object) -> bool:
        if isinstance(value, bool):
            return False
        return isinstance(value, int) or (hasattr(value, "dtype") and value.dtype.is_integer())

    if hasattr(self, "dtype") and self.dtype.is_floating_point() and isinstance(exponent, (int, float)):
        # a floating-point tensor and a Python exponent: the exponent in the tensor's type, as torchlib
        return op.Pow(self, op.Constant(value=ir.tensor(exponent, dtype=self.dtype)))
    if hasattr(self, "dtype") and integral(self) and isinstance(exponent, float):
        return op.Pow(op.Cast(self, to=ir.DataType.FLOAT), exponent)  # torch promotes to float32
    if not (integral(self) and integral(exponent)) or isinstance(self, int) and isinstance(exponent, int):
        return op.Pow(self, exponent)
    if isinstance(self, int):
        return _integer_power(op.Constant(value=ir.tensor(self, dtype=exponent.dtype)), exponent, _value_bits(exponent.dtype))
    if not isinstance(exponent, int):
        return _integer_power(self, op.CastLike(exponent, self), _value_bits(self.dtype))
    if exponent < 0:
        return op.Pow(self, exponent)  # torch rejects it for integers; ONNX decides
    # a Python exponent: the squarings unrolled for its bits
    result, square, rest = op.Expand(op.CastLike(op.Constant(value_int=1), self), op.Shape(self)), self, exponent
    while rest:
        if rest & 1:
            result = op.Mul(result, square)
        rest >>= 1
        if rest:
            square = op.Mul(square, square)
    return result


@registry.register_onnx_translation("aten::pow.Scalar")
def _aten_pow_scalar_integer_exact(self: float, exponent: TensorType) -> TensorType:
    """``c ** n`` for a Python number ``c`` and a tensor ``n``, exact for integers.

    Pattern: ``31 ** positions`` in int64 (polynomial hashes); torchlib emits ``Pow``, which
    onnxruntime computes through float64 for integers (see :func:`_aten_pow_integer_exact`). An int
    ``c`` with an integer ``n``: repeated squaring with wrapping ``Mul``; otherwise ``Pow`` with
    torch's promotion (a float ``c`` over an integer ``n`` gives float32). Output: ``n``'s shape.
    Models: none in the sweep; the Python-scalar form of BLT's hash.
    Upstream: onnxscript torchlib ``aten_pow_scalar`` (plain ``Pow``); no report found
    Remove when: onnxruntime's integer ``Pow`` is exact and wraps.
    """
    if isinstance(self, int) and exponent.dtype.is_integer():
        base = op.Constant(value=ir.tensor(self, dtype=exponent.dtype))
        return _integer_power(base, exponent, _value_bits(exponent.dtype))
    if exponent.dtype.is_integer() or exponent.dtype == ir.DataType.BOOL:
        dtype = ir.DataType.FLOAT if not isinstance(self, int) else INT64.dtype
        return op.Pow(op.Cast(op.Constant(value=ir.tensor(self, dtype=dtype)), to=dtype), op.Cast(exponent, to=dtype))
    return op.Pow(op.Cast(op.Constant(value=ir.tensor(float(self), dtype=exponent.dtype)), to=exponent.dtype), exponent)


def _wrapping_int64_sum(self: TensorType, axes: Optional[TensorType], keepdims: bool) -> TensorType:
    """ReduceSum of an int64 tensor that wraps around on overflow like torch: the low and high 32-bit
    halves are summed separately (each partial sum stays far below 2**53, so onnxruntime's float64
    accumulation is exact) and recombined with wrapping ``Mul``/``Add``."""
    low_mask = op.Constant(value=ir.tensor(0xFFFFFFFF, dtype=ir.DataType.INT64))
    half = op.Constant(value=ir.tensor(1 << 32, dtype=ir.DataType.INT64))
    low = op.BitwiseAnd(self, low_mask)  # 0 <= low < 2**32
    high = op.Div(op.Sub(self, low), half)  # exact: self - low is a multiple of 2**32
    if axes is None:
        low_sum, high_sum = op.ReduceSum(low, keepdims=keepdims), op.ReduceSum(high, keepdims=keepdims)
    else:
        low_sum, high_sum = op.ReduceSum(low, axes, keepdims=keepdims), op.ReduceSum(high, axes, keepdims=keepdims)
    return op.Add(op.Mul(high_sum, half), low_sum)


@registry.register_onnx_translation("aten::sum.dim_IntList")
def _aten_sum_int64_exact(self: TensorType, dim: Optional[list[int]] = None, keepdim: bool = False, dtype: int = -1) -> TensorType:
    """``torch.sum(x, dim)`` exact for int64 (wrapping around on overflow, as torch).

    Pattern: BLT's rolling polynomial hash sums ``token * prime ** i`` in int64, far past 2**53;
    onnxruntime's ``ReduceSum`` accumulates int64 in float64, so sums lose their low bits and
    saturate at 2**63 - 1 (a sum of 2**60 and 1 gives 2**60). For int64 input the low and high
    32-bit halves are summed apart (exact up to 2**21 terms per output element) and recombined with
    wrapping ``Mul``/``Add``; other types: ``ReduceSum`` as torchlib. ``dtype`` casts the result.
    Output: the reduced shape.
    Models: BltModel and BltForCausalLM (onnx parity).
    Upstream: onnxscript torchlib ``aten_sum_dim_IntList`` (plain ``ReduceSum``); onnxruntime's
        int64 ``ReduceSum`` kernel (float64 accumulation); no report found
    Remove when: onnxruntime sums int64 in int64.
    """
    if len(self.shape) == 0:
        result = op.Identity(self)
    else:
        axes = None if dim is None else op.Constant(value=ir.tensor([dim] if isinstance(dim, int) else list(dim), dtype=ir.DataType.INT64))
        if self.dtype == ir.DataType.INT64:
            result = _wrapping_int64_sum(self, axes, keepdim)
        elif axes is None:
            result = op.ReduceSum(self, keepdims=keepdim)
        else:
            result = op.ReduceSum(self, axes, keepdims=keepdim)
    if dtype != -1 and dtype is not None:
        result = op.Cast(result, to=dtype)
    return result
