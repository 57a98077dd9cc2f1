"""A generation folder's ``export.json``: its schema version, the roles of its parts, and
:func:`read_manifest`, which reads and checks it (used by the generator, the CLI and the folder writer).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..errors import ManifestError
from ..folders import MANIFEST_NAME
from ..runtime.et_runner import OWN_METHOD_PREFIX

#: version of the ``export.json`` layout of a generation folder; readers refuse other versions
GENERATION_SCHEMA_VERSION = 1
#: the roles a generation folder's parts play (``export.json`` ``parts.<name>.role``)
PART_ROLES = ("encoder", "prefill", "decode")


def read_manifest(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and check a generation folder's ``export.json``.

    Raises:
        ManifestError: the folder or manifest is missing or unreadable, the schema version is unknown,
            it is not a generation folder, a part's file is missing, or a path leaves the folder.
    """
    root = Path(directory)
    path = root / MANIFEST_NAME
    if not path.is_file():
        raise ManifestError(f"{root} is not an exported generation folder: {MANIFEST_NAME} is missing")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ManifestError(f"{path} cannot be read: {error}") from error
    if not isinstance(manifest, dict):
        raise ManifestError(f"{path} is not a JSON object")
    version = manifest.get("schema_version")
    if version != GENERATION_SCHEMA_VERSION:
        raise ManifestError(f"{path}: unknown schema_version {version!r} (this version of hf-exporters reads {GENERATION_SCHEMA_VERSION})")
    parts = manifest.get("parts")
    if manifest.get("kind") != "generation" or not isinstance(parts, dict) or not parts:
        raise ManifestError(f"{path} does not describe a generation export (no 'parts'); export with --task text-generation")
    resolved_root = root.resolve()
    for name, part in parts.items():
        if not isinstance(part, dict):
            raise ManifestError(f"{path}: part {name!r} is not a JSON object")
        if part.get("role") not in PART_ROLES:
            raise ManifestError(f"{path}: part {name!r} has an unknown role {part.get('role')!r} (known: {', '.join(PART_ROLES)})")
    roles = [part["role"] for part in parts.values()]
    if len(set(roles)) != len(roles):
        raise ManifestError(f"{path}: two parts share a role ({', '.join(sorted(r for r in set(roles) if roles.count(r) > 1))})")
    decode = next((part for part in parts.values() if part.get("role") == "decode"), {})
    in_program = isinstance(decode.get("cache"), dict) and decode["cache"].get("kind") == "program"
    for role in ("decode",) if in_program else ("prefill", "decode"):  # an in-program cache: one part runs the prompt too
        if role not in roles:
            raise ManifestError(f"{path}: no part has the role {role!r}; a generation folder needs a prefill and a decode part")
    methods_by_file: dict[str, list[tuple[str, Any]]] = {}
    for name, part in parts.items():
        if "method" in part and (not isinstance(part["method"], str) or not part["method"] or part["method"].startswith(OWN_METHOD_PREFIX)):
            raise ManifestError(f"{path}: part {name!r} has a 'method' that is not a method name: {part['method']!r}")
        methods_by_file.setdefault(str(part.get("file")), []).append((name, part.get("method")))
    for file, named in methods_by_file.items():
        if len(named) < 2:
            continue
        if any(method is None for _, method in named):
            raise ManifestError(f"{path}: parts {', '.join(repr(n) for n, _ in named)} share {file!r}, and part "
                                f"{next(n for n, m in named if m is None)!r} names no 'method' of it")
        methods = [method for _, method in named]
        if len(set(methods)) != len(methods):
            raise ManifestError(f"{path}: parts {', '.join(repr(n) for n, _ in named)} share {file!r} and a method "
                                f"({', '.join(sorted({m for m in methods if methods.count(m) > 1}))})")
    for name, part in parts.items():
        for rel in [part.get("file"), *part.get("files", [])]:
            if not isinstance(rel, str) or not rel:
                raise ManifestError(f"{path}: part {name!r} has no file")
            target = (root / rel).resolve()
            if Path(rel).is_absolute() or not target.is_relative_to(resolved_root):
                raise ManifestError(f"{path}: part {name!r} names a path outside the folder: {rel!r}")
            if not target.is_file():
                raise ManifestError(f"{path}: part {name!r}: file {rel!r} is missing")
    return manifest

