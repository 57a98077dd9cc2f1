"""Run a saved ``.onnx`` model in onnxruntime (CPU) with the inputs of a transformers forward."""

from __future__ import annotations

import os
import re
from typing import Any

import numpy as np
import torch

from ..deps import require
from ..shapes import tensor_leaves


class OrtRunner:
    """``run(inputs) -> [np.ndarray]``: the model's outputs in graph order (the pytree flatten order of
    the eager output, caches included).

    The input mapping is flattened in ``torch.export`` order (:func:`hf_exporters.shapes.tensor_leaves`;
    caches are flattened once their types are registered as pytree nodes) and fed to the session's
    inputs by position, matched by name. Inputs the graph does not take (a ``None``, a Python scalar
    folded into the graph) are not fed.

    Raises:
        MissingDependencyError: onnxruntime is not installed.
        ValueError: the inputs do not provide a tensor for every graph input.
    """

    def __init__(self, path: str | os.PathLike[str], providers: list[str] | None = None):
        ort = require("onnxruntime", "Running an ONNX model")
        options = ort.SessionOptions()
        options.log_severity_level = 3
        self.path = str(path)
        self.session = ort.InferenceSession(self.path, options, providers=providers or ["CPUExecutionProvider"])
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]

    def feeds(self, inputs: dict[str, Any]) -> dict[str, np.ndarray]:
        """``{graph input name: array}`` for ``inputs``."""
        return {name: _to_numpy(tensor) for name, tensor in self._ordered(tensor_leaves(inputs))}

    def _ordered(self, leaves: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
        """``(graph input name, leaf)`` in graph order: by position when the counts agree, else by name.

        Raises:
            ValueError: a graph input has no leaf.
        """
        if len(leaves) == len(self.input_names):
            return [(name, leaf) for name, (_, leaf) in zip(self.input_names, leaves)]
        by_name = dict(leaves)
        missing = [n for n in self.input_names if n not in by_name]
        if missing:
            raise ValueError(
                f"the ONNX model takes {len(self.input_names)} inputs ({', '.join(self.input_names)}) "
                f"but the inputs flatten to {len(leaves)} tensors ({', '.join(n for n, _ in leaves)})"
            )
        return [(n, by_name[n]) for n in self.input_names]

    def __call__(self, inputs: dict[str, Any]) -> list[np.ndarray]:
        return self.session.run(self.output_names, self.feeds(inputs))

    def run_bound(self, inputs: dict[str, Any]) -> list[Any]:
        """Run with onnxruntime's IOBinding: ``inputs`` may hold ``onnxruntime.OrtValue`` leaves (outputs of an
        earlier call, bound as they are, with no copy), and the outputs are returned as ``OrtValue`` in the
        session's memory, in graph order, for the next call to bind: a generation loop's cache never passes
        through numpy. Tensors in ``inputs`` are bound over their own memory (no copy for a contiguous CPU tensor).

        Raises:
            ValueError: as :meth:`feeds`.
        """
        ort = require("onnxruntime", "Running an ONNX model")
        leaves = self._ordered(tensor_leaves(inputs, (torch.Tensor, ort.OrtValue)))
        binding = self.session.io_binding()
        arrays = []  # the numpy views bound below must outlive the run
        for name, value in leaves:
            if isinstance(value, ort.OrtValue):
                binding.bind_ortvalue_input(name, value)
            else:
                arrays.append(_to_numpy(value))
                binding.bind_cpu_input(name, arrays[-1])
        for name in self.output_names:
            binding.bind_output(name, "cpu")
        self.session.run_with_iobinding(binding)
        return binding.get_outputs()


def _to_numpy(tensor: torch.Tensor) -> np.ndarray:
    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        return tensor.float().numpy()
    return tensor.contiguous().numpy()


_NO_KERNEL = re.compile(r"Could not find an implementation for (\S+?)\((\d+)\) node with name '([^']*)'")


def missing_kernel(error: BaseException) -> tuple[str, int, str] | None:
    """``(op type, opset version, node name)`` when ``error`` is onnxruntime refusing a session because its
    providers have no kernel for a node (``NOT_IMPLEMENTED : Could not find an implementation for Add(14) node
    with name 'node_add_10'``), else None."""
    found = _NO_KERNEL.search(str(error))
    return (found.group(1), int(found.group(2)), found.group(3)) if found else None
