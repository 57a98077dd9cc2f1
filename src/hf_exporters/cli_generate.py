"""``hf-exporters generate DIR --prompt ...``: run generation from an exported generation folder.

Registered on the main app by ``hf_exporters.cli`` with :func:`register`.
"""

from __future__ import annotations

import enum
import time
from pathlib import Path
from typing import Optional

import typer


class _Runtime(str, enum.Enum):
    """Where ``generate`` runs the folder's parts (another value is a usage error, status 2)."""

    python = "python"
    cpp = "cpp"


#: ``generate --compare-eager``: the exported ids differ from eager generate() (1 is an error, 2 a usage error)
EXIT_IDS_DIFFER = 3


def generate(
    directory: Path = typer.Argument(..., help="Folder written by 'hf-exporters export --task text-generation'."),
    prompt: str = typer.Option(..., "--prompt", "-p", help="Text to continue (encoded with the folder's tokenizer)."),
    max_new_tokens: int = typer.Option(20, "--max-new-tokens", "-n", min=1, help="Number of tokens to generate at most (>= 1)."),
    do_sample: bool = typer.Option(False, "--sample/--greedy", help="Sample with the generation config's warpers instead of greedy."),
    compare_eager: bool = typer.Option(False, "--compare-eager", help="Also run eager generate() on the source checkpoint and compare ids."),
    model: Optional[Path] = typer.Option(None, "--model", "-m", help="Checkpoint for --compare-eager (default: the one recorded in export.json)."),
    runtime: _Runtime = typer.Option(
        _Runtime.python, "--runtime", help="python (the backend's Python runtime) | cpp (ExecuTorch folders: the C++ runner, make cpp).",
    ),
) -> None:
    """Generate text with the exported parts in the backend's runtime; print the text and tokens per second.

    Exit status: 0 generated (and, with --compare-eager, equal to eager); 1 an error (a bad or corrupt
    folder, a folder without tokenizer, a prompt longer than the folder takes, a missing checkpoint for
    --compare-eager: one 'error:' line); 2 a usage error; 3 the exported ids differ from eager
    generate(); 130 / 143 interrupted by SIGINT / SIGTERM.
    """
    from . import interrupts
    from .errors import HfExportersError

    try:
        with interrupts.handled():
            _generate(directory, prompt, max_new_tokens, do_sample, compare_eager, model, runtime.value)
    except interrupts.Interrupted as stop:
        typer.echo(f"error: {stop}", err=True)
        raise typer.Exit(stop.exit_code) from None
    except HfExportersError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from None


def _generate(
    directory: Path, prompt: str, max_new_tokens: int, do_sample: bool, compare_eager: bool, model: Optional[Path], runtime: str
) -> None:
    import torch

    from .errors import InputError
    from .generation import ExportedGenerator

    if not prompt.strip():
        raise InputError("the prompt is empty: give --prompt some text to continue")
    if compare_eager and model is not None and not model.is_dir():  # refused before generating, not after
        raise InputError(f"--compare-eager --model {model}: no such checkpoint folder")
    generator = ExportedGenerator.from_pretrained(directory, runtime=runtime)
    started = time.perf_counter()
    text, input_ids, ids = generator.generate_text(prompt, max_new_tokens=max_new_tokens, do_sample=do_sample)
    seconds = time.perf_counter() - started
    new_tokens = ids.shape[1] - (1 if generator.is_encoder_decoder else input_ids.shape[1])
    typer.echo(text)
    typer.echo(
        f"{new_tokens} new tokens in {seconds:.3f} s: {new_tokens / max(seconds, 1e-9):.1f} tokens/s "
        f"({generator.manifest['backend']})"
    )
    if compare_eager:
        import transformers

        from .checkpoints import load_pretrained

        source = model or generator.manifest.get("source_model")
        if not source or not Path(source).is_dir():
            raise InputError("--compare-eager needs the source checkpoint: pass --model PATH")
        auto = transformers.AutoModelForSeq2SeqLM if generator.is_encoder_decoder else transformers.AutoModelForCausalLM
        eager_model = load_pretrained(auto, Path(source), "--compare-eager", allow_random_weights=True)
        tokenizer = getattr(generator.preprocessor, "tokenizer", generator.preprocessor)
        encoded = tokenizer([prompt], return_tensors="pt")
        with torch.no_grad():
            eager = eager_model.generate(
                **encoded, max_new_tokens=max_new_tokens, do_sample=False, generation_config=generator.generation_config
            )
        same = not do_sample and eager.tolist() == ids.tolist()
        typer.echo(f"equal to eager generate(): {'yes' if same else 'no'}")
        if not same and not do_sample:
            typer.echo(f"eager ids:    {eager.tolist()}\nexported ids: {ids.tolist()}", err=True)
            if generator.manifest.get("accuracy"):  # int8/int4 weights: greedy ids may part from eager's
                typer.echo("the folder's weights are quantized: its export checked next-token accuracy, not equal ids (export.json accuracy)", err=True)
            elif "accuracy" in generator.manifest:
                typer.echo("the folder's weights are quantized and were not checked against eager (exported with --no-validate)", err=True)
            raise typer.Exit(EXIT_IDS_DIFFER)


def register(app: typer.Typer) -> None:
    """Add the ``generate`` command to ``app``."""
    app.command("generate")(generate)
