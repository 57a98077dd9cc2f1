"""Checkpoint folders: read a transformers checkpoint saved with ``save_pretrained``, or one of the
Hugging Face cache found by its hub id (:func:`resolve_model`).

A checkpoint whose config names its own Python code (``auto_map`` in ``config.json``, for a model type
transformers does not ship) is loaded only with ``trust_remote_code=True``: without it, one
:class:`~hf_exporters.errors.InputError` refuses it before transformers could ask its ``[y/N]`` question.

The bottom layer under the export job (:mod:`hf_exporters.pipeline`) and the generation package
(:mod:`hf_exporters.generation`), which both load checkpoints; it imports neither.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from .errors import InputError
from .exporters._common import first_line


#: the files of a hub snapshot an export reads (weights, config, tokenizer, preprocessor, custom code)
SNAPSHOT_FILES = ["*.json", "*.safetensors", "*.bin", "*.model", "*.txt", "*.py", "*.tiktoken", "*.jinja"]


def resolve_model(model: str | os.PathLike[str]) -> Path:
    """The local folder of ``model``: a folder path as given, or the Hugging Face cache's snapshot of the hub
    id ``model`` (``org/name``), downloaded into that cache only when the environment allows it.

    The command line sets ``HF_HUB_OFFLINE=1`` unless the environment sets it, so by default only a
    snapshot already in the cache (``HF_HUB_CACHE``, ``HF_HOME``) is used; ``HF_HUB_OFFLINE=0`` lets
    ``huggingface_hub`` download the id's config, weights, tokenizer and code files.

    Raises:
        InputError: ``model`` is neither an existing path nor a valid hub id, or the id is not in the
            cache (offline) or cannot be downloaded; the message says which.
    """
    path = Path(model)
    if path.exists():
        return path
    text = str(model)
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        from huggingface_hub.utils import validate_repo_id

        validate_repo_id(text)
        is_id = text.count("/") <= 1 and not text.startswith((".", "/", "~"))
    except HFValidationError:
        is_id = False
    if not is_id:
        raise InputError(
            f"model folder not found: {path} (pass a local folder written by save_pretrained, or a hub id such as org/name)"
        )
    offline = bool(constants.HF_HUB_OFFLINE)
    try:
        return Path(snapshot_download(text, allow_patterns=SNAPSHOT_FILES, local_files_only=offline))
    except LocalEntryNotFoundError as error:
        if offline:
            raise InputError(
                f"{text} is not a local folder and is not in the Hugging Face cache ({constants.HF_HUB_CACHE}); "
                "HF_HUB_OFFLINE=1, so nothing was downloaded (set HF_HUB_OFFLINE=0 to download it, or pass a local folder)"
            ) from error
        raise InputError(f"cannot download {text} from the Hugging Face hub: {first_line(error)}") from error
    except Exception as error:  # noqa: BLE001 - a missing repository, a gated one, the network
        raise InputError(f"cannot download {text} from the Hugging Face hub: {first_line(error)}") from error


def remote_code_files(path: Path) -> list[str]:
    """The ``auto_map`` entries of ``path``'s ``config.json`` that transformers would import from the checkpoint's
    own Python files, when its ``model_type`` is not one transformers ships; [] otherwise."""
    try:
        raw = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return []
    auto_map = raw.get("auto_map") if isinstance(raw, dict) else None
    if not isinstance(auto_map, dict) or not auto_map:
        return []
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if raw.get("model_type") in CONFIG_MAPPING_NAMES:
        return []  # transformers has the code itself and does not run the checkpoint's
    refs = [ref for value in auto_map.values() for ref in (value if isinstance(value, (list, tuple)) else [value]) if isinstance(ref, str)]
    return sorted({ref.split("--")[-1].rsplit(".", 1)[0] + ".py" for ref in refs})


def read_config(path: Path, trust_remote_code: bool = False) -> Any:
    """The transformers config of the checkpoint folder ``path``.

    Raises:
        InputError: the folder is missing or a file, has no ``config.json``, the file cannot be read, or
            the checkpoint needs its own Python code (:func:`remote_code_files`) and ``trust_remote_code``
            is False.
    """
    import transformers

    if not path.exists():
        raise InputError(
            f"model folder not found: {path} (pass a local folder written by save_pretrained, or a hub id such as org/name)"
        )
    if not path.is_dir():
        raise InputError(f"not a model folder: {path} is a file")
    if not (path / "config.json").is_file():
        raise InputError(f"not a transformers checkpoint: {path} has no config.json")
    custom = remote_code_files(path)
    if custom and not trust_remote_code:
        raise InputError(
            f"{path} needs its own Python code to load ({', '.join(custom)}, named by auto_map in config.json); "
            "it is not run unless you pass --trust-remote-code (trust_remote_code=True): read that code first"
        )
    try:
        return transformers.AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except Exception as error:  # noqa: BLE001 - any parse or validation failure of a user's file
        raise InputError(f"not a transformers checkpoint: config.json in {path} cannot be read ({first_line(error)})") from error


def load_pretrained(
    model_class: Any, path: Path, purpose: str, allow_random_weights: bool = False, trust_remote_code: bool = False
) -> torch.nn.Module:
    """``model_class.from_pretrained(path)`` in eval mode, refusing weights transformers initialised at random.

    ``purpose`` completes the refusal ("task 'text-generation' needs ..."). ``trust_remote_code`` lets an Auto
    class import the checkpoint's own model code (see :func:`read_config`).

    Raises:
        InputError: the weights cannot be loaded, or (unless ``allow_random_weights``) some parameters
            or buffers are missing from the checkpoint or had another shape there (transformers then
            initialises them at random); the message names them.
    """
    try:
        loaded, info = model_class.from_pretrained(path, output_loading_info=True, trust_remote_code=trust_remote_code)
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


def load_preprocessor(path: Path, trust_remote_code: bool = False) -> Any:
    """The tokenizer of the checkpoint (or export) folder ``path``, or None when it has no tokenizer
    files or they cannot be loaded (example inputs then come from the config); ``trust_remote_code`` lets
    a tokenizer with its own code load."""
    import transformers

    if any((path / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt")):
        try:
            return transformers.AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        except Exception:  # noqa: BLE001 - no usable tokenizer: inputs come from the config
            return None
    return None
