"""Checkpoint folders: read a transformers checkpoint saved with ``save_pretrained``.

The bottom layer under the export job (:mod:`hf_exporters.pipeline`) and the generation package
(:mod:`hf_exporters.generation`), which both load checkpoints; it imports neither.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from .errors import InputError
from .exporters._common import first_line


def read_config(path: Path) -> Any:
    """The transformers config of the checkpoint folder ``path``.

    Raises:
        InputError: the folder is missing or a file, has no ``config.json``, or the file cannot be read.
    """
    import transformers

    if not path.exists():
        raise InputError(
            f"model folder not found: {path} (pass a local folder written by save_pretrained; there is no model hub access)"
        )
    if not path.is_dir():
        raise InputError(f"not a model folder: {path} is a file")
    if not (path / "config.json").is_file():
        raise InputError(f"not a transformers checkpoint: {path} has no config.json")
    try:
        return transformers.AutoConfig.from_pretrained(path)
    except Exception as error:  # noqa: BLE001 - any parse or validation failure of a user's file
        raise InputError(f"not a transformers checkpoint: config.json in {path} cannot be read ({first_line(error)})") from error


def load_pretrained(model_class: Any, path: Path, purpose: str, allow_random_weights: bool = False) -> torch.nn.Module:
    """``model_class.from_pretrained(path)`` in eval mode, refusing weights transformers initialised at random.

    ``purpose`` completes the refusal ("task 'text-generation' needs ...").

    Raises:
        InputError: the weights cannot be loaded, or (unless ``allow_random_weights``) some parameters
            or buffers are missing from the checkpoint or had another shape there (transformers then
            initialises them at random); the message names them.
    """
    try:
        loaded, info = model_class.from_pretrained(path, output_loading_info=True)
    except Exception as error:  # noqa: BLE001
        raise InputError(f"cannot load {path} as {getattr(model_class, '__name__', model_class)}: {first_line(error)}") from error
    mismatched = [m[0] if isinstance(m, (tuple, list)) else m for m in (info.get("mismatched_keys") or [])]
    fresh = sorted(set(info.get("missing_keys") or []) | set(mismatched))
    if fresh and not allow_random_weights:
        shown = ", ".join(fresh[:4]) + (f" and {len(fresh) - 4} more" if len(fresh) > 4 else "")
        raise InputError(
            f"{path} has no weights for {len(fresh)} parameter(s) of {type(loaded).__name__} ({shown}): "
            f"{purpose} needs a head this checkpoint does not have, and exporting randomly initialised weights "
            "would be meaningless; choose the checkpoint's own task (or pass --allow-random-weights)"
        )
    return loaded.eval()


def load_preprocessor(path: Path) -> Any:
    """The tokenizer of the checkpoint (or export) folder ``path``, or None when it has no tokenizer
    files or they cannot be loaded (example inputs then come from the config)."""
    import transformers

    if any((path / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt")):
        try:
            return transformers.AutoTokenizer.from_pretrained(path)
        except Exception:  # noqa: BLE001 - no usable tokenizer: inputs come from the config
            return None
    return None
