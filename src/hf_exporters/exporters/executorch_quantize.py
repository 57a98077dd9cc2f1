"""Quantized linear layers for ExecuTorch's XNNPACK backend, with torchao (``ExecutorchConfig.quantize``).

Applied in the ExecuTorch exporter's Stage 1 (backend preparation), before the trace, to a copy of the
model (the caller's model is left in float). Two modes, named as optimum-executorch's ``--qlinear``:

- ``8da4w``: int8 activations quantized per token at run time, int4 weights with one scale per group of
  ``group_size`` input features (torchao ``Int8DynamicActivationIntxWeightConfig(weight_dtype=int4,
  PerGroup(group_size))``; default group 32).
- ``8da8w``: the same with int8 weights, one scale per output channel (XNNPACK groups 4-bit weights only:
  a ``group_size`` is refused).

XNNPACK's partitioner recognises torchao's quantize and dequantize pattern around each ``linear`` and runs
it as a dynamically quantized fully connected kernel. A linear whose input features are not a multiple of
the group size stays float.

Embeddings (``ExecutorchConfig.quantize_embeddings``, ``--qembedding`` as optimum-executorch names it):

- ``8w``: every ``nn.Embedding`` table in int8, one scale per row (torchao ``IntxWeightOnlyConfig(int8,
  PerAxis(0))``). After the lowering, ExecuTorch's own quant fusion (``quant_fusion_and_const_prop_pass``)
  replaces each ``dequantize_affine`` + ``embedding`` pair with ``quantized_decomposed::embedding_byte``,
  a kernel of ExecuTorch's quantized operator library (a gather is not XNNPACK's: it runs outside the
  delegate, as the float lookup does). The table of all-MiniLM-L6-v2 (30522 x 384) is half its weights.

The other ops stay float32.

Why torchao's ``quantize_`` before the trace and not PT2E (``prepare_pt2e`` / ``convert_pt2e`` with ExecuTorch's
``XNNPACKQuantizer``): the XNNPACK quantizer of the pinned executorch 1.4.1 describes weights per tensor or per
output channel only (``get_symmetric_quantization_config``: no group size), so it cannot express ``8da4w``'s
int4 weights in groups of 32, the mode that makes a decoder small and fast; ExecuTorch's own LLM export and
optimum-executorch also quantize linears with torchao's configs. One path serves both modes,
so ``8da8w`` (which PT2E could express) takes it too; XNNPACK's partitioner claims the pattern either path
leaves (``dequantize_affine`` / ``choose_qparams_affine`` around ``linear``), as the delegated-op tests check.

The accuracy of a quantized artifact is not element parity: the pipeline measures it against float32 eager
on real sentences (:mod:`hf_exporters.runtime.embedding_accuracy`). On all-MiniLM-L6-v2 ``8da8w`` keeps a
mean cosine of 0.9989 and passes; ``8da4w`` (group 32) reaches 0.963 and is refused by that check.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

import torch

from ..deps import require
from ..errors import InputError

logger = logging.getLogger("hf_exporters")

#: quantization modes (``--quantize`` with ``--backend executorch``) -> weight bits
QUANTIZE_MODES: dict[str, int] = {"8da4w": 4, "8da8w": 8}
#: embedding quantization modes (``--qembedding``) -> weight bits
EMBEDDING_MODES: dict[str, int] = {"8w": 8}
#: the group size of each mode when none is given (None: one scale per output channel)
DEFAULT_GROUP_SIZE: dict[str, int | None] = {"8da4w": 32, "8da8w": None}


def check_quantize(mode: str | None, group_size: int | None = None) -> tuple[str | None, int | None]:
    """``(mode, group size)`` with the mode's default group size filled in.

    Raises:
        InputError: an unknown mode, a group size without a mode or with ``8da8w`` (XNNPACK groups 4-bit
            weights only), or a group size that is not a power of 2 of at least 32 (XNNPACK's grouped int4
            kernels take groups of 32, 64, ...).
    """
    if mode is None:
        if group_size is not None:
            raise InputError("--group-size applies to --quantize 8da4w")
        return None, None
    if mode not in QUANTIZE_MODES:
        raise InputError(f"unknown ExecuTorch quantization {mode!r}; choose one of: {', '.join(QUANTIZE_MODES)}")
    if group_size is not None and QUANTIZE_MODES[mode] != 4:
        raise InputError(f"--group-size applies to --quantize 8da4w: XNNPACK runs {mode}'s int8 weights with one scale per output channel only")
    if group_size is not None and (group_size < 32 or group_size & (group_size - 1)):
        raise InputError(f"--group-size must be a power of 2 of at least 32 (32, 64, 128, ...: XNNPACK's kernels), got {group_size}")
    return mode, group_size if group_size is not None else DEFAULT_GROUP_SIZE[mode]


def check_embedding_quantize(mode: str | None) -> str | None:
    """``mode`` when it is an embedding quantization mode (or None).

    Raises:
        InputError: an unknown mode.
    """
    if mode is not None and mode not in EMBEDDING_MODES:
        raise InputError(f"unknown embedding quantization {mode!r}; choose one of: {', '.join(EMBEDDING_MODES)}")
    return mode


def quantize_embeddings(model: torch.nn.Module, mode: str) -> int:
    """Quantize every ``nn.Embedding`` of ``model`` in place for ``mode`` (int8 rows, one scale per row).

    Only tables whose forward is ``nn.Embedding``'s own are quantized: a subclass with its own forward
    (ProphetNet's and FSMT's positional embeddings, which compute positions from ``padding_idx``) stays
    float. ``padding_idx`` is cleared on each quantized table: for ``nn.Embedding.forward`` it only stops
    gradients to that row (the lookup is the same), and ExecuTorch's fusion pattern matches only an
    ``embedding`` call without it.

    Returns:
        the number of tables quantized.

    Raises:
        MissingDependencyError: torchao is not installed.
        InputError: the model has no plain ``nn.Embedding`` table.
    """
    require("torchao", "ExecuTorch quantization")
    from torchao.quantization import IntxWeightOnlyConfig, quantize_
    from torchao.quantization.granularity import PerAxis

    tables = [m for m in model.modules() if isinstance(m, torch.nn.Embedding) and type(m).forward is torch.nn.Embedding.forward]
    if not tables:
        raise InputError(f"--qembedding {mode}: the model has no nn.Embedding table to quantize")
    for table in tables:
        table.padding_idx = None
    weight_dtype = torch.int8 if EMBEDDING_MODES[mode] == 8 else torch.int4
    chosen = {id(m) for m in tables}
    quantize_(model, IntxWeightOnlyConfig(weight_dtype=weight_dtype, granularity=PerAxis(0)), filter_fn=lambda module, _fqn: id(module) in chosen)
    return len(tables)


def fuse_quantized_embeddings(edge: Any) -> int:
    """Replace each ``dequantize_affine`` + ``embedding`` pair in every method of the lowered ``edge``
    program manager with ExecuTorch's ``quantized_decomposed::embedding_byte`` (in place), and register
    that operator's out variant for ``to_executorch``.

    Returns:
        the number of quantized embedding lookups in the programs.

    Raises:
        RuntimeError: a ``dequantize_affine`` is left in a program (ExecuTorch has no kernel for it).
    """
    import executorch.kernels.quantized  # noqa: F401  (registers the quantized operators' out variants)
    from executorch.exir.passes.quant_fusion_pass import quant_fusion_and_const_prop_pass

    lookups = 0
    for method in sorted(edge.methods):
        program = edge.exported_program(method)
        quant_fusion_and_const_prop_pass(program)
        targets = [str(node.target) for node in program.graph.nodes if node.op == "call_function"]
        left = [t for t in targets if "dequantize_affine" in t]
        if left:
            raise RuntimeError(f"{len(left)} dequantize_affine node(s) left in method {method} after ExecuTorch's quant fusion: no kernel runs them")
        lookups += sum("embedding_byte" in t for t in targets)
    return lookups


def quantize_linears(
    model: torch.nn.Module, mode: str, group_size: int | None, *, in_place: bool = False
) -> tuple[torch.nn.Module, int, int]:
    """A copy of ``model`` (``model`` itself with ``in_place``) whose ``nn.Linear`` layers are quantized for ``mode``.

    Returns:
        ``(quantized copy, linears quantized, linears left float)``: a linear is left float when its
        input features are not a multiple of ``group_size``.

    Raises:
        MissingDependencyError: torchao is not installed.
        InputError: no linear layer could be quantized.
    """
    require("torchao", "ExecuTorch quantization")
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
    from torchao.quantization.granularity import PerAxis, PerGroup

    quantized = model if in_place else copy.deepcopy(model)
    linears = [m for m in quantized.modules() if isinstance(m, torch.nn.Linear)]
    chosen = {id(m) for m in linears if group_size is None or m.in_features % group_size == 0}
    if not chosen:
        raise InputError(
            f"--quantize {mode}: none of the model's {len(linears)} linear layers has input features divisible by the group size {group_size}"
        )
    weight_dtype = torch.int4 if QUANTIZE_MODES[mode] == 4 else torch.int8
    granularity: Any = PerGroup(group_size) if group_size is not None else PerAxis(0)
    config = Int8DynamicActivationIntxWeightConfig(weight_dtype=weight_dtype, weight_granularity=granularity)
    if len(chosen) < len(linears):
        logger.warning(
            "--quantize %s: %d of %d linear layers stay float (input features not a multiple of the group size %s)",
            mode, len(linears) - len(chosen), len(linears), group_size,
        )
    quantize_(quantized, config, filter_fn=lambda module, _fqn: id(module) in chosen)
    return quantized, len(chosen), len(linears) - len(chosen)
