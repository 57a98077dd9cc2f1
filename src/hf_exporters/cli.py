"""The ``hf-exporters`` command line."""

from __future__ import annotations

import enum
import json
import logging
import math
import os
import sys
from pathlib import Path
from typing import Optional

import typer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

#: exit statuses (README "Errors and exit codes"); generate --compare-eager adds 3 (ids differ,
#: hf_exporters.cli_generate.EXIT_IDS_DIFFER); an interrupt exits with 128 + the signal (130, 143)
EXIT_ERROR = 1
EXIT_USAGE = 2


class _App(typer.Typer):
    """The command line as a process runs it: a usage error is one ``error:`` line with status 2 (the
    CLI library's convention), an unexpected exception one ``error:`` line with status 1 (the
    traceback only with ``HFX_TRACEBACK=1``), never a traceback panel."""

    def __call__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        from typer._click import exceptions as click_errors

        kwargs["standalone_mode"] = False
        try:
            code = super().__call__(*args, **kwargs)
        except click_errors.NoArgsIsHelpError as error:
            typer.echo(error.ctx.get_help() if error.ctx is not None else str(error))
            code = 0
        except click_errors.UsageError as error:
            where = error.ctx.command_path if error.ctx is not None else os.path.basename(sys.argv[0] or "hf-exporters")
            hint = f" (see '{where} --help')"
            typer.echo(f"error: {error.format_message()}{hint}", err=True)
            code = EXIT_USAGE
        except typer.Abort:
            typer.echo("error: interrupted", err=True)
            code = 130
        except KeyboardInterrupt as error:
            code = getattr(error, "exit_code", 130)
            typer.echo(f"error: {error or 'interrupted'}", err=True)
        except Exception as error:  # noqa: BLE001 - the last line of defence: never a traceback
            if os.environ.get("HFX_TRACEBACK"):
                raise
            from .exporters._common import first_line

            typer.echo(f"error: unexpected {first_line(error)} (a bug in hf-exporters; HFX_TRACEBACK=1 prints the traceback)", err=True)
            code = EXIT_ERROR
        sys.exit(code or 0)


app = _App(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Export Hugging Face transformers models to torch.export (.pt2), ONNX and ExecuTorch (.pte), checked in the real runtime.",
)


class _OnStaticAxis(str, enum.Enum):
    warn = "warn"
    error = "error"


def _fail(message: str, code: int = 1) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


@app.command()
def export(
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Local model folder (save_pretrained) or hub id (org/name) in the Hugging Face cache (HF_HUB_OFFLINE=0 to download). Default: the embedded all-MiniLM-L6-v2."),
    output: Path = typer.Option(..., "--output", "-o", help="Folder to write (artifact, config, tokenizer, export.json)."),
    backend: str = typer.Option("dynamo", "--backend", "-b", help="dynamo | onnx | executorch"),
    task: Optional[str] = typer.Option(None, "--task", "-t", help="Task (Auto class); default: from the config's architectures."),
    dynamic: bool = typer.Option(False, "--dynamic", help="Dynamic batch and sequence axes (Dim.AUTO on every axis)."),
    recipe: Optional[str] = typer.Option(None, "--recipe", help="ExecuTorch backend: xnnpack | portable | cuda (default xnnpack)."),
    validate: bool = typer.Option(True, "--validate/--no-validate", help="Run the artifact and compare with eager."),
    atol: Optional[float] = typer.Option(None, "--atol", help="Parity tolerance (max abs diff); default per backend."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a non-empty output folder."),
    aoti: bool = typer.Option(False, "--aoti", help="dynamo: also compile an AOTInductor package (model.aoti.pt2) for C++ (needs g++)."),
    max_seq_len: Optional[int] = typer.Option(
        None, "--max-seq-len", min=2, help="executorch: upper bound of every dynamic axis (a generation folder's prompt plus new tokens); default 128."
    ),
    allow_random_weights: bool = typer.Option(
        False, "--allow-random-weights", help="Export even when the checkpoint lacks weights transformers then initialises at random (a head)."
    ),
    opset: Optional[int] = typer.Option(
        None, "--opset", help="onnx: the ONNX opset (18 to the newest supported); default 23, 22 with --optimize ort-cpu."
    ),
    optimize: Optional[str] = typer.Option(
        None,
        "--optimize",
        help="onnx: none | default (the onnxscript optimizer) | ort-cpu (also onnxruntime's fused attention, skip layer norm, GELU).",
    ),
    quantize: Optional[str] = typer.Option(
        None,
        "--quantize",
        help="onnx: int8-dynamic | int8-static (onnxruntime's quantizer); executorch: 8da4w | 8da8w (torchao, int8 dynamic "
        "activations, int4 / int8 weights). Checked against float32 eager on shipped sentences (sentence-embedding accuracy; "
        "text-generation: next-token agreement and KL divergence); needs a tokenizer. Linears whose input features are not a "
        "multiple of --group-size stay float.",
    ),
    group_size: Optional[int] = typer.Option(
        None, "--group-size", help="executorch --quantize 8da4w: input features per weight scale (a power of 2, at least 32; default 32). 8da8w is per channel only."
    ),
    qembedding: Optional[str] = typer.Option(
        None,
        "--qembedding",
        help="executorch: 8w (every embedding table in int8, one scale per row; ExecuTorch's quantized embedding kernel). "
        "Checked like --quantize; needs a tokenizer.",
    ),
    kv_cache: str = typer.Option(
        "io",
        "--kv-cache",
        help="text-generation with executorch: io (the cache is an input and output of every step) | program (one method "
        "holding the key/value cache as mutable buffers, batch 1, --max-seq-len positions, driven by position as "
        "ExecuTorch's LLM runner drives it).",
    ),
    custom_sdpa: bool = typer.Option(
        True,
        "--custom-sdpa/--no-custom-sdpa",
        help="With --kv-cache program: write and attend the cache with ExecuTorch's LLM operators (llama::update_cache, "
        "llama::custom_sdpa; each step attends over the filled positions only). --no-custom-sdpa keeps torch's attention "
        "over the whole cache.",
    ),
    on_static_axis: _OnStaticAxis = typer.Option(
        "warn", "--on-static-axis", help="With --dynamic, an axis that ends static (fixed by the trace or pinned by a guard): warn | error."
    ),
    trust_remote_code: bool = typer.Option(
        False, "--trust-remote-code", help="Run the checkpoint's own Python code (auto_map in config.json) to load it; read that code first."
    ),
    dtype: Optional[str] = typer.Option(
        None,
        "--dtype",
        help="Cast the model and inputs before the export: float32 | float16 | bfloat16 (or fp32, fp16, bf16); checked against eager in that dtype and against float32.",
    ),
) -> None:
    """Export a checkpoint with one backend, check it against eager PyTorch, and write the folder.

    Exit status: 0 written; 1 an error (one 'error:' line, nothing written); 2 a usage error;
    130 / 143 interrupted by SIGINT / SIGTERM (nothing written).
    """
    from . import interrupts
    from .errors import InputError
    from .exporters.onnx_optimize import OPTIMIZE_LEVELS, check_opset
    from .exporters.executorch_quantize import EMBEDDING_MODES
    from .exporters.executorch_quantize import QUANTIZE_MODES as EXECUTORCH_QUANTIZE_MODES
    from .exporters.onnx_quantize import QUANTIZE_MODES
    from .precision import DTYPES

    if optimize is not None and optimize not in OPTIMIZE_LEVELS:
        raise typer.BadParameter(f"{optimize!r} is not one of {', '.join(OPTIMIZE_LEVELS)}", param_hint="'--optimize'")
    if dtype is not None and dtype not in DTYPES:
        raise typer.BadParameter(f"{dtype!r} is not one of float32, float16, bfloat16, fp32, fp16, bf16", param_hint="'--dtype'")
    modes = (*QUANTIZE_MODES, *EXECUTORCH_QUANTIZE_MODES)
    if quantize is not None and quantize not in modes:
        raise typer.BadParameter(f"{quantize!r} is not one of {', '.join(modes)}", param_hint="'--quantize'")
    if qembedding is not None and qembedding not in EMBEDDING_MODES:
        raise typer.BadParameter(f"{qembedding!r} is not one of {', '.join(EMBEDDING_MODES)}", param_hint="'--qembedding'")
    if kv_cache not in ("io", "program"):
        raise typer.BadParameter(f"{kv_cache!r} is not one of io, program", param_hint="'--kv-cache'")
    if opset is not None and backend == "onnx":
        try:
            check_opset(opset)
        except InputError as error:
            raise typer.BadParameter(str(error), param_hint="'--opset'") from error
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        with interrupts.handled():
            _export(
                model, output, backend, task, dynamic, recipe, validate, atol, overwrite, aoti, max_seq_len, allow_random_weights,
                _OnStaticAxis(on_static_axis).value, opset, optimize, quantize, trust_remote_code, dtype, group_size, qembedding, kv_cache,
                custom_sdpa,
            )
    except interrupts.Interrupted as stop:
        _fail(f"{stop}; nothing was written to {output}", stop.exit_code)


def _export(
    model: Optional[str],
    output: Path,
    backend: str,
    task: Optional[str],
    dynamic: bool,
    recipe: Optional[str],
    validate: bool,
    atol: Optional[float],
    overwrite: bool,
    aoti: bool,
    max_seq_len: Optional[int],
    allow_random_weights: bool,
    on_static_axis: str = "warn",
    opset: Optional[int] = None,
    optimize: Optional[str] = None,
    quantize: Optional[str] = None,
    trust_remote_code: bool = False,
    dtype: Optional[str] = None,
    group_size: Optional[int] = None,
    qembedding: Optional[str] = None,
    kv_cache: str = "io",
    custom_sdpa: bool = True,
) -> None:
    from .checkpoints import resolve_model
    from .errors import HfExportersError, InputError
    from .pipeline import build_inputs, check_output_folder, default_model_path, export_to_folder, load_checkpoint, make_config, make_exporter

    try:
        # an unknown backend, a missing extra or options the backend refuses fail before the model loads
        make_config(
            make_exporter(backend), dynamic, recipe, max_seq_len, on_static_axis, opset=opset, optimize=optimize, quantize=quantize,
            group_size=group_size, quantize_embeddings=qembedding,
        )
        if atol is not None and not (atol >= 0 and math.isfinite(atol)):
            raise InputError(f"--atol must be a finite number >= 0, got {atol}")
        path = resolve_model(model) if model else default_model_path()
        check_output_folder(output, overwrite, source=path)
        if aoti and backend != "dynamo":
            raise InputError(f"--aoti compiles the dynamo backend's ExportedProgram; backend is {backend!r}")
        if kv_cache != "io" and task != "text-generation":
            raise InputError(f"--kv-cache applies to --task text-generation exports, not {task or 'a single export'!r}")
        if not custom_sdpa and kv_cache != "program":
            raise InputError("--no-custom-sdpa applies to --kv-cache program exports (the other layouts use torch's attention)")
        if kv_cache == "program" and backend != "executorch":
            raise InputError(f"--kv-cache program holds the cache in an ExecuTorch program; use --backend executorch, not {backend!r}")
        if task in ("text-generation", "text2text-generation"):
            from .generation import export_generation_folder

            # generation exports are always dynamic: prefill and decode graphs serve every length
            manifest = export_generation_folder(
                path, backend, output, recipe=recipe, validate=validate, overwrite=overwrite, aoti=aoti,
                allow_random_weights=allow_random_weights, max_seq_len=max_seq_len, opset=opset, optimize=optimize,
                trust_remote_code=trust_remote_code, quantize=quantize, group_size=group_size, quantize_embeddings=qembedding,
                kv_cache=kv_cache, custom_sdpa=custom_sdpa, dtype=dtype,
            )
            parts = ", ".join(f"{name} ({part['file']})" for name, part in manifest["parts"].items())
            typer.echo(f"exported {manifest['model_class']} for generation with {backend} to {output}: {parts}")
            if manifest.get("accuracy"):
                accuracy = manifest["accuracy"]
                typer.echo(
                    f"next-token accuracy vs eager {accuracy.get('reference_dtype', 'float32')} over {accuracy['positions']} positions of {accuracy['prompts']} prompts: "
                    f"top-1 agreement {accuracy['top1_agreement']:.3f}, mean KL {accuracy['mean_kl']:.3g} nats (max {accuracy['max_kl']:.3g})"
                )
            elif "accuracy" in manifest:
                typer.echo("quantized weights, not checked against eager (--no-validate)")
            return
        loaded, preprocessor, task_name = load_checkpoint(path, task, allow_random_weights, trust_remote_code)
        inputs = build_inputs(loaded, preprocessor)
        manifest = export_to_folder(
            loaded,
            inputs,
            backend,
            output,
            dynamic=dynamic,
            recipe=recipe,
            validate=validate,
            atol=atol,
            preprocessor=preprocessor,
            task=task_name,
            overwrite=overwrite,
            aoti=aoti,
            max_seq_len=max_seq_len,
            on_static_axis=on_static_axis,
            opset=opset,
            optimize=optimize,
            quantize=quantize,
            dtype=dtype,
            group_size=group_size,
            quantize_embeddings=qembedding,
            source_model=str(path.resolve()),
            trust_remote_code=trust_remote_code,
        )
    except HfExportersError as error:
        _fail(str(error))
        return
    worst = max((p["max_abs_diff"] for p in manifest["parity"]), default=None)
    in_dtype = f" in {manifest['dtype']}" if manifest.get("dtype") not in (None, "float32") else ""
    versus_float32 = manifest.get("parity_float32")
    if "accuracy" in manifest:
        accuracy = manifest["accuracy"]
        modes = ", ".join([*([quantize] if quantize else []), *([f"{qembedding} embeddings"] if qembedding else [])])
        typer.echo(
            f"exported {manifest['model_class']} ({task_name}) with {backend}, {modes}, to {output / manifest['artifact']} "
            f"in {manifest['export_seconds']:.1f} s; sentence embeddings vs eager float32 over {accuracy['sentences']} sentences: "
            f"min cosine {accuracy['min_cosine']:.4f}, mean {accuracy['mean_cosine']:.4f}, nearest-neighbour agreement {accuracy['neighbour_agreement']:.2f}"
        )
        return
    typer.echo(
        f"exported {manifest['model_class']} ({task_name}) with {backend} to {output / manifest['artifact']} "
        f"in {manifest['export_seconds']:.1f} s"
        + (f"; max abs diff vs eager{in_dtype} {worst:.2e} over {len(manifest['parity'])} input set(s)" if worst is not None else "; not validated")
        + (f", vs float32 eager {versus_float32['max_abs_diff']:.2e}" if versus_float32 else "")
    )
    if manifest["static_axes"]:
        axes = ", ".join(
            f"{a['input']}[{a['axis']}]={a['size']}" + (f" (guard {a['guard']}" + (f" at {a['source']}" if a.get("source") else "") + ")" if a.get("guard") else "")
            for a in manifest["static_axes"]
        )
        typer.echo(f"warning: axes asked to be dynamic ended static: {axes}", err=True)
    for axis in manifest.get("constrained_axes", []):
        high = "inf" if axis["high"] is None else axis["high"]
        typer.echo(f"warning: dynamic axis {axis['input']}[{axis['axis']}] refuses size 1 (accepts {axis['low']}..{high})", err=True)


@app.command()
def patches(
    backend: Optional[str] = typer.Option(None, "--backend", "-b", help="Only this backend (and its parent scopes)."),
    model: Optional[str] = typer.Option(
        None,
        "--model",
        "-m",
        metavar="CLASS",
        help="Only the workarounds whose docstring's 'Models:' line names this model class (matching rule above).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """List every registered patch and fix: backend, stage, target, and the upstream report it works around.

    The stage is the exporter stage that applies the workaround, as declared
    where the workaround is registered.

    --model CLASS keeps the workarounds whose docstring's 'Models:' line (or
    'Known to hit:') names the class. The line is cut into names at spaces
    and punctuation; names compare without case and without '-', '_', '.'.
    A name matches when it is CLASS; or CLASS's family, the class name
    without its head (Model, LMHeadModel, For...): 'Bert' and 'BertModel'
    match BertForMaskedLM, 'Qwen2.5-VL' matches
    Qwen2_5_VLForConditionalGeneration; or a sub-model of that family, the
    family followed by Vision, Text, Audio, Speech, Encoder or Decoder
    (Kimi_K25VisionModel for Kimi_K25ForConditionalGeneration). A line that
    starts with 'every', 'all' or 'any' (a workaround for every model, such
    as the SDPA patch) matches every class. Other prose ('Qwen2.5/3-VL') is
    not read.
    """
    import hf_exporters  # noqa: F401  (registers the built-in workarounds)

    from .registry import list_workarounds

    for optional in ("hf_exporters.workarounds.onnx", "hf_exporters.workarounds.executorch"):
        try:
            __import__(optional)
        except ImportError:
            continue
    known_roots = {"dynamo", "onnx", "executorch"}
    if backend is not None and backend.split(".")[0] not in known_roots:
        _fail(f"unknown backend {backend!r}; choose one of: {', '.join(sorted(known_roots))}")
    workarounds = list_workarounds(backend)
    if model is not None:
        workarounds = [w for w in workarounds if w.names_model(model)]
    rows = [
        {
            "backend": w.backend,
            "stage": w.stage,
            "kind": w.kind,
            "target": w.target,
            "name": w.name,
            "upstream": w.upstream or "",
            "remove_when": w.remove_when or "",
            "models": w.models or "",
        }
        for w in sorted(workarounds, key=lambda w: (w.backend.split(".")[0], w.stage, w.backend))
    ]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    title = f"{len(rows)} workaround(s)" + (f" for {backend}" if backend else "") + (f" naming {model}" if model else "")
    table = Table(title=title, show_lines=False)
    columns = ("backend", "stage", "kind", "target", "upstream") + (("models",) if model else ())
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*(row[column] for column in columns))
    Console(width=200).print(table)


def _register_subcommands() -> None:
    """Add the commands that live in their own modules (sweep, generate)."""
    import importlib

    for name in ("hf_exporters.cli_sweep", "hf_exporters.cli_generate"):
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name != name:
                raise
            continue
        module.register(app)


_register_subcommands()


def main() -> None:  # pragma: no cover - entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
