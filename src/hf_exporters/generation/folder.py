"""The generation folder: export every part, write the folder and its ``export.json``, check it against eager.

- :func:`export_for_generation`: export each :class:`~hf_exporters.generation.parts.GenerationPart` with
  one exporter; returns :class:`GenerationArtifacts`.
- :meth:`GenerationArtifacts.save_pretrained`: write each part's file, the configs, the tokenizer and
  the manifest, checking each saved part against eager (staged, then moved into place; see
  :mod:`hf_exporters.folders`).
- :func:`export_generation_folder`: both, from a checkpoint folder (``hf-exporters export --task text-generation``).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..checkpoints import load_preprocessor, load_pretrained, read_config, resolve_model
from ..errors import InputError, ParityError
from ..exporters.result import ExportResult
from ..folders import AOTI_SUFFIX, MANIFEST_NAME, check_output_folder, staged_folder
from ..pipeline import describe_tensors, dynamic_axes, library_versions, load_onnx_in_dtype, make_config, make_exporter
from ..precision import DTYPE_RTOL, cast_for_export, cast_to_executorch_backend, check_dtype_request, dtype_name
from ..runtime.compare import compare_leaves, evaluation_mode, raise_if_eager_nonfinite
from ..shapes import tensor_leaves
from .accuracy import NEW_TOKENS, check_generation_accuracy, prompt_ids
from .generator import ExportedGenerator, load_part_runners
from .manifest import GENERATION_SCHEMA_VERSION
from .parts import KV_CACHE_LAYOUTS, GenerationPart, build_parts, program_cache_parts, relaxed_shapes

#: relative part of a part's parity tolerance: outputs may differ by ``atol + PARITY_RTOL * max|eager output|``
PARITY_RTOL = 1e-5


class GenerationArtifacts(dict):
    """``{part name: native artifact}`` (``ExportedProgram``, ``ONNXProgram`` or ``ExecutorchProgramManager``)
    returned by :func:`export_for_generation`, with what is needed to write the artifact folder.

    Attributes:
        exporter: the exporter that produced the artifacts.
        parts: ``{part name: GenerationPart}``.
        model: the eager model (its config, generation config, and the reference for parity).
        dynamic_axes: ``{part name: {input name: [axes]}}`` symbolic in each exported program.
        methods: ``{part name: method name}`` when the parts are the methods of one program (ExecuTorch
            ``one_program``: one ``model.pte`` at the folder's root); empty when each part is its own file.
        program_seconds: the shared lowering and serialisation seconds of that one program (the manifest's
            ``program``; each part's ``export_seconds`` then counts its own stages only).
        results: ``{part name: ExportResult}`` of each part's export (empty when not exported here);
            the manifest's part entries take ``stage_seconds``, ``capture_strategy``,
            ``workarounds_fired`` and (ExecuTorch) ``partitions`` from them.
        backend_entries: the exporter's own ``export.json`` entries after the export (``"executorch"``:
            the quantization applied; ``"onnx"``: opset, optimisation level, fusions, quantization), written
            at the manifest's top level as a single-model folder has them.
        quantized: the parts' weights are quantized (``--quantize`` or ``--qembedding``): the folder is
            checked by next-token accuracy (:mod:`hf_exporters.generation.accuracy`) instead of element parity.
    """

    def __init__(self, exporter: Any, model: torch.nn.Module, parts: dict[str, GenerationPart], artifacts: dict[str, Any], dynamic_axes: dict[str, Any]):
        super().__init__(artifacts)
        self.exporter = exporter
        self.model = model
        self.parts = parts
        self.dynamic_axes = dynamic_axes
        self.export_seconds: dict[str, float] = {}
        self.results: dict[str, ExportResult] = {}
        self.methods: dict[str, str] = {}
        self.program_seconds: dict[str, float] = {}
        self.backend_entries: dict[str, Any] = {}
        self.quantized = False

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the parts compute in: ``--dtype``'s when it was asked for, else the reduced precision (float16,
        bfloat16) some of the model's floating parameters are in (a checkpoint may keep a few modules in float32),
        the loosest of them when there are two, else float32."""
        asked = getattr(self.model, "hfx_export_dtype", None)
        if asked is not None:
            return asked
        held = {p.dtype for p in self.model.parameters() if p.is_floating_point()}
        reduced = [d for d in held if DTYPE_RTOL.get(d, 0.0) > 0]
        return max(reduced, key=DTYPE_RTOL.__getitem__) if reduced else torch.float32

    def save_pretrained(
        self,
        directory: str | os.PathLike[str],
        preprocessor: Any = None,
        validate: bool = True,
        overwrite: bool = True,
        source_model: str | None = None,
        aoti: bool = False,
        trust_remote_code: bool | None = None,
    ) -> dict[str, Any]:
        """Write every part's file (``<part>/<artifact name>``), ``config.json``, ``generation_config.json``,
        the tokenizer or processor files (when ``preprocessor`` is given) and ``export.json``.

        With ``validate``, each saved part is run in the backend's runtime on its example inputs and
        compared with the eager module (max abs difference, recorded as ``parity``; the tolerance is the
        exporter's ``default_atol`` plus :data:`PARITY_RTOL` times the largest eager output value, plus
        :data:`~hf_exporters.precision.DTYPE_RTOL` of the model's dtype times that value for a float16 or
        bfloat16 model).
        A :attr:`quantized` folder is checked instead by running it as a generator, teacher-forced, over
        the fixed prompt set tokenized by ``preprocessor``: next-token top-1 agreement and KL divergence
        against float32 eager (:func:`~hf_exporters.generation.accuracy.check_generation_accuracy`,
        recorded as the manifest's ``accuracy``; each part's ``parity`` is then None).
        The folder is written beside the target and moved into place at the end. ``source_model`` (the checkpoint
        folder) and ``trust_remote_code`` (whether the checkpoint's own code was allowed to run to load it) are
        recorded as given, None when the caller does not say.

        With ``aoti`` (dynamo only), each part is also compiled into an AOTInductor package
        (``<part>/model.aoti.pt2``, the part's ``aoti_package`` in the manifest) for the C++ runner, and
        checked like the part when ``validate``.

        Returns:
            the manifest written.

        Raises:
            InputError: ``directory`` exists, is not empty and ``overwrite`` is False; ``aoti`` for another
                backend; a quantized folder to validate without a tokenizer (``preprocessor``); an ONNX part in
                float16 or bfloat16 that onnxruntime's CPU provider has no kernel for (validated or not).
            ParityError: a part's outputs differ from eager beyond the exporter's ``default_atol``; a
                quantized folder's next-token accuracy is below the thresholds.
            ExportStageError: the AOTInductor compile failed.
        """
        out = Path(directory)
        check_output_folder(out, overwrite)
        if aoti and self.exporter.name != "dynamo":
            raise InputError(f"aoti compiles the dynamo backend's programs; these parts were exported with {self.exporter.name!r}")
        prompts = prompt_ids(preprocessor) if self.quantized and validate else None
        dtype = self.dtype
        rtol = PARITY_RTOL + DTYPE_RTOL.get(dtype, 0.0)  # a float16 model's parts: within float16's rounding of its outputs
        manifest: dict[str, Any] = {}
        # eager runs in eval mode, as the parts were traced; the model's training flags come back afterwards
        with staged_folder(out, manifest) as staging, evaluation_mode(self.model):
            parts_manifest: dict[str, Any] = {}
            shared: Path | None = None  # the one program whose methods the parts are
            for name, artifact in self.items():
                part = self.parts[name]
                method = self.methods.get(name)
                if method is not None:
                    if shared is None:
                        shared = self.exporter.save(artifact, staging)
                    path, folder = shared, staging
                    files = [str(shared.relative_to(staging))]
                else:
                    folder = staging / name
                    folder.mkdir()
                    path = self.exporter.save(artifact, folder)
                    files = sorted(str(p.relative_to(staging)) for p in folder.rglob("*") if p.is_file())
                entry: dict[str, Any] = {
                    "role": part.role,
                    "file": str(path.relative_to(staging)),
                    **({"method": method} if method is not None else {}),
                    "files": files,
                    "inputs": _describe_inputs(part.inputs),
                    "outputs": part.output_names,
                    "dynamic_axes": self.dynamic_axes.get(name, {}),
                    "cache": part.cache,
                    **({"extra": part.extra} if part.extra else {}),
                    "export_seconds": round(self.export_seconds.get(name, 0.0), 3),
                    **(self.results[name].manifest_entries() if name in self.results else {}),
                }
                checked = [path]
                loaded = None  # the part's runner, when loading it was a check of its own
                if self.exporter.name == "onnx" and DTYPE_RTOL.get(dtype, 0.0) > 0:
                    loaded = load_onnx_in_dtype(self.exporter, path, dtype)  # refused here, validated or not, not when a user loads it
                if aoti:
                    package = self.exporter.compile_aoti(artifact, folder / ("model" + AOTI_SUFFIX))
                    entry["aoti_package"] = str(package.relative_to(staging))
                    entry["files"] = sorted(str(p.relative_to(staging)) for p in folder.rglob("*") if p.is_file())
                    checked.append(package)
                if self.quantized:
                    entry["parity"] = None  # int8/int4 weights: judged by next-token accuracy below
                for path_checked in checked if validate and not self.quantized else []:
                    if path_checked == path and loaded is not None:
                        runner = loaded
                    else:
                        runner = self.exporter.load_runner(path_checked, method) if method is not None else self.exporter.load_runner(path_checked)
                    with torch.no_grad():
                        expected = (part.reference() if part.reference else part.module)(**_copy_inputs(part.inputs))
                    expected = list(expected) if isinstance(expected, tuple) else [expected]
                    actual = [torch.as_tensor(a) for a in runner(_copy_inputs(part.inputs))]
                    diffs = compare_leaves(list(zip(part.output_names, expected)), actual, self.exporter.default_atol)
                    worst = max((d.max_abs_diff for d in diffs), default=0.0)
                    # float32 rounding grows with the values' size (logits of tens): atol + rtol * max|eager|
                    scale = max((float(e.abs().max()) for e in expected if isinstance(e, torch.Tensor) and e.numel()), default=0.0)
                    limit = self.exporter.default_atol + rtol * scale
                    ok = all(not d.nonfinite and d.max_abs_diff <= limit for d in diffs) and len(actual) == len(expected)
                    entry["aoti_parity" if path_checked != path else "parity"] = {
                        "atol": self.exporter.default_atol, "rtol": rtol, "max_abs_eager": scale, "max_abs_diff": worst, "ok": ok
                    }
                    if not ok:
                        failing = [d.name for d in diffs if d.nonfinite or d.max_abs_diff > limit]
                        raise_if_eager_nonfinite(list(zip(part.output_names, expected)), failing)
                        raise ParityError(
                            f"part {name!r}{' (AOTInductor package)' if path_checked != path else ''}: outputs differ from eager beyond atol {self.exporter.default_atol} + "
                            f"rtol {rtol} x max|eager| {scale:.3g} (max abs diff {worst:.3g}; {len(actual)} outputs vs {len(expected)} expected)"
                        )
                parts_manifest[name] = entry
            genai = self._genai_layout(staging, parts_manifest, validate)
            if self.exporter.name == "onnx" and not self.methods:
                self._share_onnx_weights(staging, parts_manifest, genai, validate)
            accuracy = None
            if prompts is not None:
                described = {"backend": self.exporter.name, "is_encoder_decoder": bool(getattr(self.model.config, "is_encoder_decoder", False)),
                             "parts": parts_manifest, "onnxruntime_genai": genai}
                runners = load_part_runners(staging, described, self.exporter)
                generator = ExportedGenerator(staging, described, runners, self.model.config, self.model.generation_config)
                accuracy = check_generation_accuracy(self.model, generator, prompts).as_dict()
            self.model.config.save_pretrained(staging)
            self.model.generation_config.save_pretrained(staging)
            if preprocessor is not None:
                preprocessor.save_pretrained(staging)
            manifest.update(
                {
                    "schema_version": GENERATION_SCHEMA_VERSION,
                    "kind": "generation",
                    "backend": self.exporter.name,
                    "recipe": getattr(getattr(self.exporter, "config", None), "backend", None),
                    "model_class": type(self.model).__name__,
                    "is_encoder_decoder": bool(getattr(self.model.config, "is_encoder_decoder", False)),
                    # token ids are in [0, vocab_size): the rows of the input embedding table (readers refuse others)
                    "vocab_size": _embedding_rows(self.model),
                    "source_model": source_model,
                    "trust_remote_code": trust_remote_code,
                    "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                    "versions": library_versions(),
                    # the dtype the parts compute in (float32, or float16 / bfloat16 from --dtype or the checkpoint)
                    "dtype": dtype_name(dtype),
                    "parts": parts_manifest,
                    **(
                        {"program": {"file": str(shared.relative_to(staging)), "methods": list(self.methods.values()),
                                     "stage_seconds": {k: round(v, 3) for k, v in self.program_seconds.items()}}}
                        if shared is not None else {}
                    ),
                    "onnxruntime_genai": genai,
                    **self.backend_entries,
                    # a quantized folder's next-token accuracy; None when it was not checked (validate=False)
                    **({"accuracy": accuracy} if self.quantized else {}),
                }
            )
        return manifest

    def _share_onnx_weights(self, staging: Path, parts_manifest: dict[str, Any], genai: dict[str, Any], validate: bool) -> None:
        """Move the ONNX parts' graphs to the folder's root with one copy of their weights
        (:func:`~hf_exporters.generation.onnx_weights.share_weights`) and update the manifest's ``file`` and
        ``files`` and the genai config's file names. With ``validate``, each moved graph must return
        exactly what its original returns on the part's example inputs.

        Raises:
            ValueError: a moved graph returns other values (the folder is then left as it was).
        """
        from .genai import rename_genai_files
        from .onnx_weights import share_weights

        def check(name: str, old: Path, new: Path) -> None:
            if not validate:
                return
            inputs = self.parts[name].inputs
            before = self.exporter.load_runner(old)(_copy_inputs(inputs))
            after = self.exporter.load_runner(new)(_copy_inputs(inputs))
            if len(after) != len(before) or not all(np.array_equal(a, b) for a, b in zip(after, before)):
                raise ValueError(f"part {name!r}: the graph with shared weights returns other values than the exported graph")

        old = {name: entry["file"] for name, entry in parts_manifest.items()}
        files = share_weights(staging, old, check)
        for name, entry in parts_manifest.items():
            entry["file"], entry["files"] = files[name][0], files[name]
        if genai.get("layout"):
            rename_genai_files(staging, {old[name]: files[name][0] for name in old})

    def _genai_layout(self, staging: Path, parts_manifest: dict[str, Any], validate: bool) -> dict[str, Any]:
        """ONNX decoder-only folders: rename the parts' graph inputs and outputs as onnxruntime-genai reads
        them and write its ``genai_config.json`` (:mod:`hf_exporters.generation.genai`). The renamed graphs are
        written beside the originals and, with ``validate``, must return exactly what the originals return;
        only then do they replace them, all parts or none. Returns the manifest's ``onnxruntime_genai``
        entry: ``{"layout": True, "config": file}``, or ``{"layout": False, "config": None, "reason": why not}``
        (a folder that does not qualify, or a renaming that failed: the export itself stands).
        """
        import shutil

        from ..exporters._common import first_line
        from .genai import apply_genai_layout, genai_graph_refusal, genai_layout_refusal, graph_dims, write_genai_config

        roles = {entry["role"] for entry in parts_manifest.values()}
        cache = next((entry.get("cache") or {} for entry in parts_manifest.values() if entry["role"] == "decode"), {})
        refusal = genai_layout_refusal(
            self.exporter.name, roles, cache, bool(getattr(self.model.config, "is_encoder_decoder", False))
        )
        if refusal is None and getattr(self.model.generation_config, "eos_token_id", None) is None and getattr(self.model.config, "eos_token_id", None) is None:
            refusal = "the model has no eos_token_id, which onnxruntime-genai requires"
        if refusal is None:
            refusal = genai_graph_refusal([staging / entry["file"] for entry in parts_manifest.values()], int(cache.get("layers") or 0))
        if refusal is not None:
            return {"layout": False, "config": None, "reason": refusal}
        layers = int(cache["layers"])
        renamed = staging / ".genai-layout"
        graphs: dict[str, Any] = {}
        try:
            renamed.mkdir()
            for name, entry in parts_manifest.items():
                path = staging / entry["file"]
                out = renamed / name
                out.mkdir()
                inputs, outputs = apply_genai_layout(path, layers, out)
                if validate:
                    part = self.parts[name]
                    before = self.exporter.load_runner(path)(_copy_inputs(part.inputs))
                    after = self.exporter.load_runner(out / path.name)(_copy_inputs(part.inputs))
                    same = len(after) == len(before) and np.array_equal(after[0][:, -1], before[0]) and all(
                        np.array_equal(a, b) for a, b in zip(after[1:], before[1:])
                    )
                    if not same:
                        raise ValueError(f"part {name!r}: the renamed graph's outputs differ from the exported graph's")
                graphs[name] = (inputs, outputs, out)
            decode = next(name for name, entry in parts_manifest.items() if entry["role"] == "decode")
            dims = graph_dims(renamed / decode / Path(parts_manifest[decode]["file"]).name)
        except Exception as error:  # noqa: BLE001 - the folder stands without the layout, saying why
            shutil.rmtree(renamed, ignore_errors=True)
            return {"layout": False, "config": None, "reason": f"the renaming for onnxruntime-genai failed: {first_line(error)}"}
        for name, (inputs, outputs, out) in graphs.items():
            entry = parts_manifest[name]
            folder = (staging / entry["file"]).parent
            for file in out.iterdir():
                shutil.move(str(file), str(folder / file.name))
            entry["outputs"] = outputs
            if len(entry["inputs"]) == len(inputs):
                for described, graph_name in zip(entry["inputs"], inputs):
                    described["name"] = graph_name
            entry["files"] = sorted(str(p.relative_to(staging)) for p in folder.rglob("*") if p.is_file())
        shutil.rmtree(renamed, ignore_errors=True)
        graph_names = {
            entry["role"]: {"file": entry["file"], "inputs": graphs[name][0], "outputs": graphs[name][1]}
            for name, entry in parts_manifest.items()
        }
        config = write_genai_config(staging, self.model.config, self.model.generation_config, graph_names, dims)
        return {"layout": True, "config": config}


def _check_room_for_prompts(prompts: list[torch.Tensor], config: Any, seq2seq: bool = False) -> None:
    """Refuse an ExecuTorch bound (``max_seq_len``) too short for the accuracy check's longest prompt and
    its decode positions.

    Raises:
        InputError: "--max-seq-len N is too short for the accuracy check of a quantized folder: ...".
    """
    if not hasattr(config, "max_seq_len"):
        return
    from ..workarounds.executorch.fx_program_fixes import UNBOUNDED_DIM_MAX

    bound = config.max_seq_len or UNBOUNDED_DIM_MAX
    longest = max(p.shape[1] for p in prompts)
    needed = max(longest, NEW_TOKENS + 1) if seq2seq else longest + NEW_TOKENS - 1  # seq2seq: the prompt is the encoder's
    if needed > bound:
        raise InputError(
            f"--max-seq-len {bound} is too short for the accuracy check of a quantized folder: its longest prompt is "
            f"{longest} tokens and {NEW_TOKENS - 1} decode positions follow ({needed}); give --max-seq-len {needed} or more, or --no-validate"
        )


def _embedding_rows(model: torch.nn.Module) -> int | None:
    try:
        embeddings = model.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        return None
    return int(embeddings.num_embeddings) if isinstance(embeddings, torch.nn.Embedding) else None


def _describe_inputs(inputs: dict[str, Any]) -> list[dict[str, Any]]:
    return describe_tensors(tensor_leaves(inputs))


def _copy_inputs(inputs: dict[str, Any]) -> dict[str, Any]:
    return {k: ([t.clone() for t in v] if isinstance(v, list) else v.clone() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}


def _widen_batch(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """``inputs`` with a batch of 1 repeated to a batch of 2 (every tensor whose leading size is the batch).

    The examples only drive the trace. From a batch-1 example, size-oblivious sizes keep the batch
    symbolic but torch.export then solves reshapes such as ``view(batch, seq, -1, head_dim)`` to head
    counts like ``4 // batch`` (seen with Mistral and Gemma3), which the ONNX SDPA lowering refuses and
    which would fix the batch of later graphs; a batch of 2 gives plain head counts.
    """
    ids = inputs.get("input_ids", inputs.get("input_features", inputs.get("inputs_embeds")))
    if not isinstance(ids, torch.Tensor) or ids.dim() == 0 or ids.shape[0] != 1:
        return dict(inputs)
    return {k: (v.repeat(2, *([1] * (v.dim() - 1))) if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == 1 else v) for k, v in inputs.items()}


def export_for_generation(
    exporter: Any, model: torch.nn.Module, inputs: Mapping[str, Any], config: Any = None, generation_config: Any = None, kv_cache: str = "io",
    custom_sdpa: bool = True,
) -> GenerationArtifacts:
    """Export each part of ``model``'s generation loop with ``exporter`` (dynamic batch, sequence and cache axes).

    Args:
        exporter: a ``DynamoExporter``, ``OnnxExporter`` or ``ExecutorchExporter``.
        model: a transformers generative model.
        inputs: ``generate()`` keyword arguments (``input_ids (B, T)``, ``attention_mask (B, T)``, ...).
        config: the exporter's config (``dynamic_shapes`` is set per part; other fields are kept).
        generation_config: optional ``GenerationConfig``; ``cache_implementation="static"`` with
            ``max_cache_len`` exports the static-cache decode graph.
        kv_cache: ``"io"`` (the cache tensors are inputs and outputs of each step) or ``"program"``
            (ExecuTorch, decoder-only: one method whose key/value cache is held in the program as mutable
            buffers, for batch 1 and ``config.max_seq_len`` positions (default 128), driven by position;
            see :func:`~hf_exporters.generation.parts.program_cache_parts`).
        custom_sdpa: with ``kv_cache="program"``, write and attend the cache with ExecuTorch's LLM operators
            (``llama::update_cache``, ``llama::custom_sdpa``: each step attends over the filled positions
            only); False keeps torch's attention over the whole static cache.

    A batch of 1 in ``inputs`` is repeated to a batch of 2 for the trace (see :func:`_widen_batch`);
    the graphs take any batch size.

    With an ``ExecutorchConfig`` whose ``one_program`` is set (the default), the parts are the methods of one
    ExecuTorch program, lowered in one call (``ExecutorchExporter.run_methods``): every part's artifact is
    that program, and the folder holds one ``model.pte``.

    ``model`` runs and is traced in eval mode; its training flags are given back.

    Returns:
        a :class:`GenerationArtifacts`: ``{part name: native artifact}`` with ``save_pretrained(dir)``.

    Raises:
        InputError: ``generate()`` cannot run on ``inputs`` or the model kind is not supported.
        ExportStageError: exporting a part failed (the message names the stage).
    """
    with evaluation_mode(model):
        return _export_for_generation(exporter, model, inputs, config, generation_config, kv_cache, custom_sdpa)


def _export_for_generation(
    exporter: Any, model: torch.nn.Module, inputs: Mapping[str, Any], config: Any, generation_config: Any, kv_cache: str, custom_sdpa: bool,
) -> GenerationArtifacts:
    base = config if config is not None else exporter.config_class()
    if kv_cache not in KV_CACHE_LAYOUTS:
        raise InputError(f"unknown --kv-cache {kv_cache!r}; choose one of: {', '.join(KV_CACHE_LAYOUTS)}")
    if kv_cache == "program":
        if exporter.name != "executorch":
            raise InputError(f"--kv-cache program holds the cache in an ExecuTorch program; use --backend executorch, not {exporter.name!r}")
        from ..workarounds.executorch.fx_program_fixes import UNBOUNDED_DIM_MAX
        from .executorch_ops import load_custom_ops

        if custom_sdpa and not load_custom_ops():
            raise InputError(
                "--custom-sdpa needs ExecuTorch's LLM operators (executorch.extension.llm.custom_ops), which the installed "
                "executorch lacks; use --no-custom-sdpa"
            )
        max_cache_len = getattr(base, "max_seq_len", None) or UNBOUNDED_DIM_MAX
        parts = program_cache_parts(model, inputs, max_cache_len, custom_ops=custom_sdpa)
    else:
        parts = build_parts(model, _widen_batch(inputs), generation_config)
    artifacts: dict[str, Any] = {}
    axes: dict[str, Any] = {}
    seconds: dict[str, float] = {}
    results: dict[str, ExportResult] = {}
    configs: dict[str, Any] = {}
    for name, part in parts.items():
        part.dynamic_shapes = relaxed_shapes(part.dynamic_shapes, part.inputs)
        configs[name] = dataclasses.replace(base, dynamic=True, dynamic_shapes=part.dynamic_shapes)
        if hasattr(configs[name], "output_path"):
            configs[name].output_path = None
    methods: dict[str, str] = {}
    program_seconds: dict[str, float] = {}
    if getattr(base, "one_program", False) and hasattr(exporter, "run_methods"):
        # ExecuTorch: every part a method of one program, lowered in one call (the weights stored once)
        # each part a method named after it; a cache held in the program is the program's one method, forward
        method_names = {name: ("forward" if kv_cache == "program" else name) for name in parts}
        try:
            by_method = exporter.run_methods(
                {method_names[name]: (part.module, _copy_inputs(part.inputs)) for name, part in parts.items()},
                {method_names[name]: config for name, config in configs.items()},
            )
            results = {name: by_method[method_names[name]] for name in parts}
        except InputError as error:
            if not getattr(error, "mixed_reasoning", False):
                raise
            results = {}  # parts traced under different shape reasoning: one program each, below
        if results:
            methods = method_names
            shared = set(getattr(exporter, "PROGRAM_STAGES", ()))
            first = next(iter(results.values()))
            program_seconds = {title: value for title, value in first.stage_seconds.items() if title in shared}
            # a part's own stages; the program's lowering and serialisation are recorded once, for the program
            seconds = {name: sum(v for k, v in result.stage_seconds.items() if k not in shared) for name, result in results.items()}
    if not results:
        for name, part in parts.items():
            started = time.perf_counter()
            results[name] = exporter.run(part.module, _copy_inputs(part.inputs), configs[name])
            seconds[name] = time.perf_counter() - started
    if kv_cache == "program":
        for result in results.values():
            _check_position_table(result.exported_program, max_cache_len)
    for name, part in parts.items():
        artifacts[name] = results[name].program
        axes[name] = dynamic_axes(results[name].exported_program, part.inputs)
    generated = GenerationArtifacts(exporter, model, parts, artifacts, axes)
    generated.methods = methods
    generated.program_seconds = program_seconds
    generated.export_seconds = seconds
    generated.results = results
    generated.backend_entries = exporter.manifest_entries() if hasattr(exporter, "manifest_entries") else {}
    generated.quantized = bool(getattr(base, "quantize", None) or getattr(base, "quantize_embeddings", None))
    return generated


def _check_position_table(program: torch.export.ExportedProgram, max_cache_len: int) -> None:
    """Refuse a program whose ``cache_position`` indexes a learned position table (GPT-2's ``wpe``) with fewer
    rows than the cache has positions: past the table's last row every step would be refused at run time.

    Raises:
        InputError: naming the table's rows and the largest ``--max-seq-len`` that fits.
    """
    from ..exporters.executorch import EMBEDDING_ROWS, input_index_bounds

    names = [spec.arg.name for spec in program.graph_signature.input_specs if spec.kind == torch.export.graph_signature.InputKind.USER_INPUT]
    bounds = input_index_bounds(program)
    for position, size, kind in zip(bounds[0::3], bounds[1::3], bounds[2::3]):
        if names[position] == "cache_position" and kind == EMBEDDING_ROWS and size < max_cache_len:
            raise InputError(
                f"--max-seq-len {max_cache_len} is more positions than the model's learned position table holds ({size} rows, "
                f"indexed by cache_position): use --max-seq-len {size} or less"
            )


def export_generation_folder(
    model_path: str | os.PathLike[str],
    backend: str,
    output: str | os.PathLike[str],
    *,
    recipe: str | None = None,
    validate: bool = True,
    overwrite: bool = False,
    prompt: str = "Exported models should give the same tokens",
    aoti: bool = False,
    allow_random_weights: bool = False,
    max_seq_len: int | None = None,
    opset: int | None = None,
    optimize: str | None = None,
    trust_remote_code: bool = False,
    quantize: str | None = None,
    group_size: int | None = None,
    quantize_embeddings: str | None = None,
    kv_cache: str = "io",
    custom_sdpa: bool = True,
    dtype: str | None = None,
) -> dict[str, Any]:
    """Load the checkpoint folder ``model_path`` (or a hub id in the Hugging Face cache; a checkpoint with its own
    code only with ``trust_remote_code``), export its generation parts with ``backend`` and write ``output``.

    The example inputs are the tokenizer's encoding of ``prompt`` (or 8 token ids when the folder has
    no tokenizer). Used by ``hf-exporters export --task text-generation`` / ``text2text-generation``.

    ``kv_cache="program"`` (executorch, decoder-only) holds the key/value cache in the program, written and
    attended with ExecuTorch's LLM operators unless ``custom_sdpa`` is False (see :func:`export_for_generation`).

    ``quantize`` (executorch ``8da4w`` / ``8da8w`` with ``group_size``; onnx ``int8-dynamic``) and
    ``quantize_embeddings`` (executorch ``8w``) quantize every part's weights as a single-model export
    does; the folder is then checked by next-token accuracy against float32 eager on the fixed prompt set
    (:mod:`hf_exporters.generation.accuracy`), which needs the checkpoint's tokenizer.

    ``dtype`` (``float16``, ``bfloat16``, ``float32`` or ``fp16``, ``bf16``, ``fp32``) casts the loaded model's
    floating parameters and buffers before the parts are captured, so every part computes in it (an ExecuTorch
    XNNPACK export keeps float16 instead of computing in float32); each part is then checked against eager in
    that dtype within :data:`~hf_exporters.precision.DTYPE_RTOL` of its largest output. Without it the parts
    compute in the checkpoint's dtype (an ExecuTorch backend casts to the dtype it computes in). The manifest's
    ``dtype`` records it.

    Returns:
        the manifest written.

    Raises:
        InputError: the folder cannot be loaded, transformers initialised some of its weights at random
            (unless ``allow_random_weights``; a base-model checkpoint has no ``lm_head``), ``output``
            exists and is not empty (without ``overwrite``), ``quantize`` is ``int8-static`` (its
            calibration would see one example per part), or a quantized export to validate has no tokenizer;
            ``dtype`` is unknown, reduced with ``quantize`` or ``quantize_embeddings``, or bfloat16 for XNNPACK.
        ExportStageError, ParityError: as :func:`export_for_generation` and :meth:`GenerationArtifacts.save_pretrained`.
    """
    import transformers

    if quantize == "int8-static":
        raise InputError("--quantize int8-static is not supported for generation exports: its calibration would see "
                         "one example prompt per part; use int8-dynamic")
    out = Path(output)
    exporter = make_exporter(backend)
    exporter_config = make_config(
        exporter, True, recipe, max_seq_len, opset=opset, optimize=optimize, quantize=quantize, group_size=group_size, quantize_embeddings=quantize_embeddings
    )
    torch_dtype = check_dtype_request(dtype, backend, getattr(exporter_config, "backend", None), quantize, quantize_embeddings)
    path = resolve_model(model_path)
    check_output_folder(out, overwrite, source=path)
    config = read_config(path, trust_remote_code)
    seq2seq = bool(getattr(config, "is_encoder_decoder", False))
    auto = transformers.AutoModelForSeq2SeqLM if seq2seq else transformers.AutoModelForCausalLM
    task = "text2text-generation" if seq2seq else "text-generation"
    preprocessor = load_preprocessor(path, trust_remote_code)
    if validate and (quantize is not None or quantize_embeddings is not None):
        # a quantized folder is checked on the tokenized prompts: refuse what cannot run them before loading
        _check_room_for_prompts(prompt_ids(preprocessor), exporter_config, seq2seq)
    model = load_pretrained(auto, path, f"task {task!r}", allow_random_weights, trust_remote_code)
    if torch_dtype is not None:
        cast_for_export(model, {}, torch_dtype)  # the parts are captured from the cast model
    elif exporter.name == "executorch":
        cast_to_executorch_backend(model, getattr(exporter_config, "backend", None))  # eager computes as the program does
    if validate and (quantize is not None or quantize_embeddings is not None) and getattr(model, "main_input_name", "input_ids") != "input_ids":
        raise InputError(
            f"the accuracy check of a quantized folder runs text prompts; {type(model).__name__} takes {model.main_input_name} "
            "(export it unquantized, or with --no-validate)"
        )
    if preprocessor is not None:
        inputs = dict(preprocessor([prompt], return_tensors="pt"))
    else:
        vocab = config.get_text_config().vocab_size
        ids = torch.arange(1, 9).remainder(vocab).unsqueeze(0)
        inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    artifacts = export_for_generation(exporter, model, inputs, exporter_config, kv_cache=kv_cache, custom_sdpa=custom_sdpa)
    return artifacts.save_pretrained(
        out, preprocessor=preprocessor, validate=validate, overwrite=overwrite, source_model=str(path.resolve()), aoti=aoti,
        trust_remote_code=trust_remote_code,
    )
