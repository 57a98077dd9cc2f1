"""``hf-exporters generate DIR --prompt ...``: run generation from an exported generation folder.

Registered on the main app by ``hf_exporters.cli`` with :func:`register`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer


def generate(
    directory: Path = typer.Argument(..., help="Folder written by 'hf-exporters export --task text-generation'."),
    prompt: str = typer.Option(..., "--prompt", "-p", help="Text to continue (encoded with the folder's tokenizer)."),
    max_new_tokens: int = typer.Option(20, "--max-new-tokens", "-n", help="Number of tokens to generate at most."),
    do_sample: bool = typer.Option(False, "--sample/--greedy", help="Sample with the generation config's warpers instead of greedy."),
    compare_eager: bool = typer.Option(False, "--compare-eager", help="Also run eager generate() on the source checkpoint and compare ids."),
    model: Optional[Path] = typer.Option(None, "--model", "-m", help="Checkpoint for --compare-eager (default: the one recorded in export.json)."),
    runtime: str = typer.Option("python", "--runtime", help="python (the backend's Python runtime) | cpp (ExecuTorch folders: the C++ runner, make cpp)."),
) -> None:
    """Generate text with the exported parts in the backend's runtime; print the text and tokens per second.

    Exits with status 1 and one line on stderr for a bad folder (unknown format, missing file),
    a folder without tokenizer, or (with --compare-eager) a missing checkpoint; status 2 when the
    exported ids differ from eager generate().
    """
    import torch

    from .errors import HfExportersError, InputError
    from .generation import ExportedGenerator

    try:
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

            source = model or generator.manifest.get("source_model")
            if not source or not Path(source).is_dir():
                raise InputError("--compare-eager needs the source checkpoint: pass --model PATH")
            auto = transformers.AutoModelForSeq2SeqLM if generator.is_encoder_decoder else transformers.AutoModelForCausalLM
            eager_model = auto.from_pretrained(source).eval()
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
                raise typer.Exit(2)
    except HfExportersError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from None


def register(app: typer.Typer) -> None:
    """Add the ``generate`` command to ``app``."""
    app.command("generate")(generate)
