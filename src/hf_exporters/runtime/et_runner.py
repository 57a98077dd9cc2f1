"""Run a ``.pte`` program with ``executorch.runtime`` (the real ExecuTorch runtime, through its pybindings)."""

from __future__ import annotations

import os
import re
from typing import Any

import torch
import torch.utils._pytree as pytree

from ..deps import require
from ..shapes import tensor_leaves


def flat_inputs(inputs: dict[str, Any]) -> list[Any]:
    """The program's inputs: every pytree leaf of ``inputs`` in ``torch.export`` order.

    Tensors are the ones :func:`~hf_exporters.shapes.tensor_leaves` names; a scalar input (``use_cache=True``)
    is a constant of the exported program, yet ExecuTorch still counts it as an input of ``forward``.
    """
    leaves, _ = pytree.tree_flatten(inputs)
    tensors = iter(t for _, t in tensor_leaves(inputs))
    flat: list[Any] = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            flat.append(next(tensors).contiguous())
        elif isinstance(leaf, (bool, int, float)):
            flat.append(leaf)
    return flat


def missing_operators(pte: str | os.PathLike[str] | bytes, runtime: Any, method: str = "forward") -> list[str]:
    """Operators (``aten::sort.values``) that the non-delegated part of ``method`` in the ``.pte``
    program calls and ``runtime`` (an ``executorch.runtime.Runtime``) registers no kernel for, in
    program order.

    ExecuTorch reports them only as ``OperatorMissing`` (error 0x14) when a method is loaded."""
    from pathlib import Path

    from executorch.exir._serialize._program import deserialize_pte_binary

    data = bytes(pte) if isinstance(pte, (bytes, bytearray)) else Path(pte).read_bytes()
    registered = set(runtime.operator_registry.operator_names)
    missing: list[str] = []
    for plan in deserialize_pte_binary(data).program.execution_plan:
        if plan.name != method:
            continue
        for operator in plan.operators:
            name = f"{operator.name}.{operator.overload}" if operator.overload else operator.name
            if name not in registered and name not in missing:
                missing.append(name)
    return missing


def execute_logging_failures(method: Any, flat: list[Any], log: Any = None) -> Any:
    """``method.execute(flat)``, with what the runtime logs during the call captured and written on to
    ``sys.stderr`` afterwards. The pybindings log through Python's ``sys.stderr``; the C++ parts write
    to file descriptor 2: both are captured.

    ``log``: a binary file, emptied and reused for the capture (a runner keeps one, so a call costs a few
    descriptor calls and no new file); a temporary file when None.

    Raises:
        RuntimeError: what ``execute`` raised ("method->execute() failed with error 0x12"), followed by
            up to three lines the runtime logged during the call: the failed check, the instruction and
            the operator (the arguments' dump that follows is left out).
    """
    import io
    import sys
    import tempfile

    if log is None:
        with tempfile.TemporaryFile() as log:
            return execute_logging_failures(method, flat, log)
    sys.stderr.flush()
    log.seek(0)
    log.truncate()
    python_log, stderr = io.StringIO(), sys.stderr
    failure: RuntimeError | None = None
    saved = os.dup(2)
    try:
        os.dup2(log.fileno(), 2)
        sys.stderr = python_log
        return method.execute(flat)
    except RuntimeError as error:
        failure = error
    finally:
        sys.stderr = stderr
        os.dup2(saved, 2)
        os.close(saved)
        text = python_log.getvalue()
        if os.fstat(log.fileno()).st_size:  # the C++ side wrote through fd 2
            log.seek(0)
            text = log.read().decode(errors="replace") + text
        if text:
            sys.stderr.write(text)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        raise failure
    # The kernel's failed check and the failing instruction come before the dump of its arguments.
    named = [line for line in lines if any(word in line.lower() for word in ("fail", "error", "attempted", "invalid", "expected"))]
    raise RuntimeError(f"{failure}: " + "; ".join((named or lines)[-3:])) from failure


def check_pte_file(path: str | os.PathLike[str] | bytes) -> None:
    """Refuse what is not a whole ``.pte`` program before the runtime sees it.

    The runtime's loader trusts its input: random bytes can pass its first checks and abort the whole
    process later (a ``UnicodeDecodeError`` thrown through pybind11 ends in ``std::terminate``). This
    reads the flatbuffer file identifier (``ET..`` at bytes 4-8) and, when present, the extended header
    (``eh00``), and checks that the file holds the program and segment data the header promises.

    Raises:
        ValueError: the file is too short, has no ExecuTorch identifier, or is truncated (the message
            gives the sizes).
    """
    from pathlib import Path

    data = bytes(path) if isinstance(path, (bytes, bytearray)) else None
    name = "the program" if data is not None else str(path)
    if data is None:
        with open(path, "rb") as handle:
            head = handle.read(64)
        size = Path(path).stat().st_size
    else:
        head, size = data[:64], len(data)
    if size < 8 or not head[4:6] == b"ET":
        raise ValueError(f"{name} is not an ExecuTorch program (.pte): no 'ET' file identifier at bytes 4-8")
    if head[8:12] == b"eh00" and len(head) >= 40:
        program_size = int.from_bytes(head[16:24], "little")
        segment_base = int.from_bytes(head[24:32], "little")
        segment_size = int.from_bytes(head[32:40], "little") if int.from_bytes(head[12:16], "little") > 24 else 0
        needed = max(program_size, segment_base + segment_size if segment_base else 0)
        if size < needed:
            raise ValueError(f"{name} is truncated: {size} bytes where its header promises {needed}")


#: what the name of every constant method the exporter stores starts with (no method of a model's does)
OWN_METHOD_PREFIX = "hf_exporters_"

#: ExecuTorch's scalar type codes (``TensorInfo.dtype()``, PyTorch's ``c10::ScalarType`` numbering) -> torch dtypes
_SCALAR_TYPES = {
    0: torch.uint8, 1: torch.int8, 2: torch.int16, 3: torch.int32, 4: torch.int64, 5: torch.float16, 6: torch.float32,
    7: torch.float64, 11: torch.bool, 15: torch.bfloat16,
}

#: the constant method the exporter stores (kept in sync with hf_exporters.exporters.executorch)
INPUT_MUTATIONS_METHOD = "hf_exporters_input_mutation_outputs"


def input_mutations_method(method: str) -> str:
    """The constant method holding the number of mutated-input outputs that ``method`` returns before the
    model's outputs: :data:`INPUT_MUTATIONS_METHOD` for ``forward``, ``<INPUT_MUTATIONS_METHOD>.<method>``
    for another method of a multi-method program (kept in sync with the C++ runner)."""
    return INPUT_MUTATIONS_METHOD if method == "forward" else f"{INPUT_MUTATIONS_METHOD}.{method}"


#: the constant method holding the embedding index bounds of ``forward`` (kept in sync with the C++ runner)
INDEX_BOUNDS_METHOD = "hf_exporters_input_index_bounds"


def index_bounds_method(method: str) -> str:
    """The constant method holding ``[position, size, kind, ...]`` for the inputs of ``method`` that index a
    tensor (see :func:`hf_exporters.exporters.executorch.input_index_bounds`); absent when no input does."""
    return INDEX_BOUNDS_METHOD if method == "forward" else f"{INDEX_BOUNDS_METHOD}.{method}"


#: the constant method holding the tied input axes of ``forward`` (kept in sync with the C++ runner)
EQUAL_AXES_METHOD = "hf_exporters_input_equal_axes"


def equal_axes_method(method: str) -> str:
    """The constant method holding ``[position_a, axis_a, position_b, axis_b, ...]`` for the input axes of
    ``method`` traced as one size (see :func:`hf_exporters.exporters.executorch.input_equal_axes`); absent
    when no two are."""
    return EQUAL_AXES_METHOD if method == "forward" else f"{EQUAL_AXES_METHOD}.{method}"


#: the constant method holding the static input axes of a dynamic ``forward`` (kept in sync with the C++ runner)
STATIC_AXES_METHOD = "hf_exporters_input_static_axes"


def static_axes_method(method: str) -> str:
    """The constant method holding ``[position, axis, size, ...]`` for the input axes of ``method`` traced at one
    size (see :func:`hf_exporters.exporters.executorch.input_static_axes`); absent when every axis is static."""
    return STATIC_AXES_METHOD if method == "forward" else f"{STATIC_AXES_METHOD}.{method}"


def check_static_axes(flat: list[Any], axes: list[tuple[int, int, int]], names: list[str] | None = None) -> None:
    """Refuse an input whose size on an axis the program traced at one size differs from it.

    Raises:
        InputError: "input 'input_ids' is 2 long on axis 0, which the program was exported for at 1 only".
    """
    from ..errors import InputError

    for position, axis, size in axes:
        value = flat[position] if position < len(flat) else None
        if isinstance(value, torch.Tensor) and axis < value.dim() and value.shape[axis] != size:
            label = repr(names[position]) if names is not None and position < len(names) else str(position)
            raise InputError(f"input {label} is {value.shape[axis]} long on axis {axis}, which the program was exported for at {size} only")


def check_equal_axes(flat: list[Any], pairs: list[tuple[int, int, int, int]], names: list[str] | None = None) -> None:
    """Refuse inputs whose axes the program traced as one size but that differ.

    Raises:
        InputError: "inputs 'input_ids' (axis 1) and 'cache_position' (axis 0) are 2 and 1 long: the
            program was exported with one size for both".
    """
    from ..errors import InputError

    for a, axis_a, b, axis_b in pairs:
        first, second = (flat[i] if i < len(flat) else None for i in (a, b))
        if not isinstance(first, torch.Tensor) or not isinstance(second, torch.Tensor) or axis_a >= first.dim() or axis_b >= second.dim():
            continue
        if first.shape[axis_a] != second.shape[axis_b]:
            label = [repr(names[i]) if names is not None and i < len(names) else str(i) for i in (a, b)]
            raise InputError(
                f"inputs {label[0]} (axis {axis_a}) and {label[1]} (axis {axis_b}) are {first.shape[axis_a]} and "
                f"{second.shape[axis_b]} long: the program was exported with one size for both"
            )


#: what an index bound of each kind counts, in the refusal (kinds of ``input_index_bounds``); kind 2 bounds
#: the run of positions an input starts (its first value, then one position per element)
_BOUND_KINDS = {0: "rows of the embedding table", 1: "positions of the axis", 2: "positions of the cache"}


def check_index_bounds(flat: list[Any], bounds: dict[int, tuple[int, int]], names: list[str] | None = None) -> None:
    """Refuse an integer input holding an index outside the tensor it indexes.

    ``flat``: the method's inputs in order; ``bounds``: position -> (size, kind); ``names``: the inputs'
    names, for the message.

    Raises:
        InputError: "input 'input_ids' holds the index 40000, outside the 30522 rows of the embedding
            table it indexes (valid: 0 to 30521)".
    """
    from ..errors import InputError

    for position, (size, kind) in bounds.items():
        value = flat[position] if position < len(flat) else None
        if not isinstance(value, torch.Tensor) or value.numel() == 0 or value.is_floating_point() or value.dtype == torch.bool:
            continue
        low, high = int(value.min()), int(value.max())
        if kind == 2 and 0 <= low and high < size:  # the run written from the first position must fit too
            start, count = int(value.reshape(-1)[0]), value.numel()
            if start + count > size:
                label = repr(names[position]) if names is not None and position < len(names) else str(position)
                raise InputError(
                    f"input {label} starts at position {start}: its {count} positions from there pass the {size} positions of the "
                    f"cache it writes (valid starts for {count}: 0 to {size - count})"
                )
        if low < 0 or high >= size:
            label = repr(names[position]) if names is not None and position < len(names) else str(position)
            raise InputError(
                f"input {label} holds the index {low if low < 0 else high}, outside the {size} {_BOUND_KINDS.get(kind, 'entries')} "
                f"it indexes (valid: 0 to {size - 1})"
            )
        if kind == 2 and value.numel() > 1:  # the operators write and attend one run from the first value, whatever the others hold
            flat_values = value.reshape(-1).long()
            steps = (flat_values[1:] - flat_values[:-1]).ne(1).nonzero()
            if len(steps):
                k = int(steps[0]) + 1
                label = repr(names[position]) if names is not None and position < len(names) else str(position)
                raise InputError(
                    f"input {label} holds the positions {int(flat_values[k - 1])} then {int(flat_values[k])} (elements {k - 1} and {k}): "
                    "the cache is written at one run of positions, each one past the one before"
                )


def _register_quantized_kernels() -> None:
    """Load ExecuTorch's quantized operator library (``executorch.kernels.quantized``), whose kernels
    (``quantized_decomposed::embedding_byte`` of an ``--qembedding`` program, ...) the wheel's runtime does
    not hold: its loading registers them with the runtime, as the C++ runner links it."""
    try:
        import executorch.kernels.quantized  # noqa: F401
    except ImportError:  # an executorch build without it: such a program fails to load, naming the operator
        pass


def _register_llm_kernels() -> None:
    """Load ExecuTorch's LLM operator library (``extension/llm/custom_ops``), whose kernels
    (``llama::update_cache`` and ``llama::custom_sdpa`` of a cache held in the program) the wheel's runtime
    does not hold, as the C++ runner links it. Only the shared library is loaded: the operators' shapes for
    tracing (ExecuTorch's ``custom_ops`` module, which imports inductor) are the exporter's to load."""
    import importlib.util
    from pathlib import Path

    if hasattr(torch.ops.llama, "custom_sdpa"):
        return
    spec = importlib.util.find_spec("executorch.extension.llm.custom_ops")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        found = sorted(Path(folder).glob("*custom_ops_aot_lib.*"))
        if found:  # an executorch build without it: such a program fails to load, naming the operator
            torch.ops.load_library(str(found[0]))
            return


#: the runtime's log line when a dynamic tensor (an input, or one computed from it) outgrew the memory planned for it
_PAST_PLANNED = re.compile(r"resize a bounded tensor")


class ExecutorchRunner:
    """Loads ``path`` (a ``.pte`` file, or its bytes) and runs its ``method`` (``forward`` by default; a
    generation folder's parts are the methods of one program).

    ``runner(inputs)`` flattens the input mapping in ``torch.export`` order (caches included, once
    :func:`hf_exporters.pytree.register_model_pytrees` has registered them), executes the method and
    returns every output tensor in order: the pytree flatten of the eager output.
    """

    def __init__(self, path: str | os.PathLike[str] | bytes, method: str = "forward", program: Any = None):
        runtime_module = require("executorch.runtime", "Running a .pte program")
        _register_quantized_kernels()
        _register_llm_kernels()
        self.runtime = runtime_module.Runtime.get()
        self.path = path
        if program is None:
            data: Any = bytes(path) if isinstance(path, (bytes, bytearray)) else str(path)
            check_pte_file(path)
            program = self.runtime.load_program(data)
        self.program = program
        if method not in self.program.method_names:
            raise ValueError(f"the program has no method {method!r} (it has {sorted(self.program.method_names)})")
        try:
            self.method = self.program.load_method(method)
        except RuntimeError as error:
            missing: list[str] = []
            if "0x14" in str(error).replace(":", ""):  # OperatorMissing
                try:
                    missing = missing_operators(path, self.runtime, method)
                except Exception:  # noqa: BLE001 - the load error stays the one reported
                    missing = []
            if not missing:
                raise
            raise RuntimeError(
                f"{error}: the program calls operators this ExecuTorch runtime has no kernel for: "
                f"{', '.join(missing)} (rewrite them at export with a patch or FX fix into ops the kernel "
                "library has, or link a kernel library that registers them)"
            ) from error
        if self.method is None:
            raise ValueError(f"the program has no method {method!r} (it has {sorted(self.program.method_names)})")
        meta = self.method.metadata
        #: each input's largest sizes (the memory ExecuTorch planned), None for a non-tensor input
        self.input_max_sizes: list[tuple[int, ...] | None] = []
        #: per input, the dtype the program takes (None for a scalar input or a dtype this table lacks)
        self.input_dtypes: list[torch.dtype | None] = []
        for index in range(meta.num_inputs()):
            try:
                info = meta.input_tensor_meta(index)
                self.input_max_sizes.append(tuple(info.sizes()))
                self.input_dtypes.append(_SCALAR_TYPES.get(int(info.dtype())))
            except Exception:  # noqa: BLE001 - a scalar input has no tensor metadata
                self.input_max_sizes.append(None)
                self.input_dtypes.append(None)
        # ExecuTorch returns the mutated user inputs (an updated StaticCache) before the model outputs;
        # the exporter records their number in a constant method.
        self._log: Any = None
        values = self._constant_ints(input_mutations_method(method))
        self.skip_outputs = values[0] if values else 0
        #: input position -> (size, kind) of the tensor axis it indexes (an index past an embedding table aborts
        #: a quantized kernel; past a cache held in the program, ``index_put`` writes out of bounds)
        values = self._constant_ints(index_bounds_method(method))
        self.index_bounds: dict[int, tuple[int, int]] = {values[i]: (values[i + 1], values[i + 2]) for i in range(0, len(values) - 2, 3)}
        #: (position_a, axis_a, position_b, axis_b) of input axes the trace tied to one size
        values = self._constant_ints(equal_axes_method(method))
        self.equal_axes: list[tuple[int, int, int, int]] = [tuple(values[i : i + 4]) for i in range(0, len(values) - 3, 4)]  # type: ignore[misc]
        #: (position, axis, size) of the input axes a dynamic program was traced at one size on
        values = self._constant_ints(static_axes_method(method))
        self.static_axes: list[tuple[int, int, int]] = [tuple(values[i : i + 3]) for i in range(0, len(values) - 2, 3)]  # type: ignore[misc]

    def _constant_ints(self, name: str) -> list[int]:
        """What the constant method ``name`` returns, as integers; ``[]`` when the program has no such method (one
        exported before the method existed, or with nothing to record)."""
        if name not in self.program.method_names:
            return []
        return [int(v) for v in self.program.load_method(name).execute([])]

    def _checked_inputs(self, inputs: dict[str, Any]) -> list[Any]:
        """``inputs`` flattened as the method takes them, after refusing what ExecuTorch would refuse with a log line
        alone (or silently drop): a value that is not a tensor or a Python number, the wrong number of inputs, a
        tensor of another dtype than the program's.

        Raises:
            InputError: naming the input ("input 'input_ids' is torch.int32, where the program takes torch.int64").
        """
        from ..errors import InputError

        for name, value in inputs.items():
            leaves = pytree.tree_leaves(value)
            odd = next((leaf for leaf in leaves if not isinstance(leaf, (torch.Tensor, bool, int, float))), None)
            if odd is not None or (isinstance(value, (list, tuple)) and not any(isinstance(leaf, torch.Tensor) for leaf in leaves)):
                what = type(odd if odd is not None else value)
                raise InputError(f"input {name!r} is a {what.__module__}.{what.__qualname__}: the runner takes torch tensors")
        flat = flat_inputs(inputs)
        expected = len(self.input_dtypes)
        if len(flat) != expected:
            raise InputError(f"the method takes {expected} input{'' if expected == 1 else 's'}; {len(flat)} given ({', '.join(map(repr, inputs))})")
        names = list(inputs) if len(inputs) == expected and all(isinstance(v, torch.Tensor) for v in inputs.values()) else None
        for position, (value, dtype) in enumerate(zip(flat, self.input_dtypes)):
            if isinstance(value, torch.Tensor) and dtype is not None and value.dtype != dtype:
                label = repr(names[position]) if names is not None else str(position)
                raise InputError(f"input {label} is {value.dtype}, where the program takes {dtype}")
        return flat

    def _past_planned_size(self, flat: list[Any], names: list[str] | None) -> str | None:
        """The refusal of the first input larger on some axis than the program was exported for, None when none is.

        ExecuTorch plans each dynamic tensor's memory for its largest number of elements, so a run fails ("Attempted
        to resize a bounded tensor") once one outgrows it; an input past its own axis bound names the cause and the
        flag that moves it. ``names``: the inputs' names when each is one tensor of ``flat``, else positions."""
        names = names if names is not None and len(names) == len(flat) else None
        for position, (value, largest) in enumerate(zip(flat, self.input_max_sizes)):
            if not isinstance(value, torch.Tensor) or largest is None or value.dim() != len(largest):
                continue
            for axis, (size, most) in enumerate(zip(value.shape, largest)):
                if size > most:
                    label = repr(names[position]) if names is not None else str(position)
                    return (
                        f"input {label} axis {axis} is {size}, the program was exported for at most {most} (re-export "
                        f"with a bound of {size} or more: --max-seq-len, ExecutorchConfig.max_seq_len, or the axis's "
                        "Dim max in dynamic_shapes)"
                    )
        return None

    def for_method(self, method: str) -> "ExecutorchRunner":
        """A runner of another method of the same program, sharing the loaded program (its weights are
        loaded once).

        Raises:
            ValueError: the program has no such method.
        """
        return ExecutorchRunner(self.path, method, program=self.program)

    def __call__(self, inputs: dict[str, Any]) -> list[torch.Tensor]:
        """Run the method on ``inputs``.

        Returns:
            the program's output tensors in flatten order (outputs that are not tensors are left out).

        Raises:
            InputError: an input is not a tensor or a Python number, the number of inputs or an input's dtype is not
                the program's, the runtime refused a size past the memory it planned while an input is larger on
                some axis than the program was exported for (a dynamic export's bound, ``--max-seq-len``), an
                input that indexes a tensor (an embedding table, a cache held in the program) holds an index outside it (checked before ``execute``: ExecuTorch's quantized embedding
                kernels abort the process on one), two input axes traced as one size differ, or an input's size on
                an axis a dynamic program was traced at one size on differs from it.
            RuntimeError: the runtime refused the inputs or a kernel failed; the message carries the
                runtime's own log lines that name the failing instruction and operator ("KernelCall
                failed at instruction 0:74 in operator aten::_upsample_bilinear2d_aa.out: 0x12").
        """
        flat = self._checked_inputs(inputs)
        names = list(inputs) if all(isinstance(v, torch.Tensor) for v in inputs.values()) else None
        if self.index_bounds or self.equal_axes or self.static_axes:
            check_static_axes(flat, self.static_axes, names)
            check_equal_axes(flat, self.equal_axes, names)
            check_index_bounds(flat, self.index_bounds, names)
        if self._log is None:
            import tempfile

            self._log = tempfile.TemporaryFile()  # the runtime's log of one call; reused by every call
        try:
            outputs = execute_logging_failures(self.method, flat, self._log)[self.skip_outputs :]
        except RuntimeError as error:
            over = self._past_planned_size(flat, names) if _PAST_PLANNED.search(str(error)) else None
            if over is None:
                raise
            from ..errors import InputError

            raise InputError(over) from error
        # Output tensors may alias the method's planned memory: copy them out before the next run. A non-tensor
        # output (an int or a size the trace made a constant, MaskFormerSwin's spatial dimensions) is not a tensor
        # leaf of eager's output, and the other runners leave it out too.
        return [o.clone() for o in outputs if isinstance(o, torch.Tensor)]
