"""The artifact folder: what an export may write, replace and leave behind.

Every export (a single artifact or a generation folder) is written into a staging folder beside the
target, named ``.<target>.tmp-<pid>-<random>`` and holding a marker file, then moved into place in one
rename. Rules:

- the target may be missing, an empty folder, or (with ``overwrite``) an earlier export whose
  ``export.json`` lists every file in it (its ``files`` entry); anything else in the folder is not ours,
  so the export refuses, names the first such file, and deletes nothing;
- a failure, an interrupt (SIGINT) or SIGTERM removes the staging folder; a staging folder left by a
  process that was killed outright (SIGKILL, power loss) is removed by the next export into the same
  parent folder once its pid is no longer alive;
- parent folders created for the target are removed again when the export fails.

This module sits below the pipeline and the generation package; it imports neither.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import interrupts
from .errors import InputError

MANIFEST_NAME = "export.json"
#: file-name ending of an AOTInductor package (``DynamoExporter.compile_aoti``) in an artifact folder:
#: ``model.aoti.pt2``, or ``<part>/model.aoti.pt2`` in a generation folder
AOTI_SUFFIX = ".aoti.pt2"
#: file inside a staging folder that marks it as ours (holds the writing process's pid)
STAGING_MARKER = ".hfx-staging"
_STAGING_NAME = re.compile(r"^\..+\.tmp-(\d+)-[0-9a-f]+$")


def written_files(folder: Path) -> list[str]:
    """Every file under ``folder`` as a POSIX path relative to it, sorted (what a manifest's ``files`` lists)."""
    found = []
    for root, dirs, files in os.walk(folder, followlinks=False):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            found.append(Path(root, name).relative_to(folder).as_posix())
    return sorted(f for f in found if f != STAGING_MARKER)


def first_foreign_entry(folder: Path, manifest: dict[str, Any]) -> str | None:
    """The first entry under ``folder`` that ``manifest['files']`` does not account for, or None.

    A file is accounted for when it is listed (or is ``export.json``); a folder when some listed file
    lies inside it. Symbolic links and special files count as files.
    """
    listed = set(manifest.get("files") or []) | {MANIFEST_NAME}
    prefixes = {p.rsplit("/", i)[0] for p in listed for i in range(1, p.count("/") + 1)}
    for root, dirs, files in os.walk(folder, followlinks=False):
        dirs.sort()
        for name in sorted(files + [d for d in dirs if os.path.islink(os.path.join(root, d))]):
            rel = Path(root, name).relative_to(folder).as_posix()
            if rel not in listed:
                return rel
        for name in dirs:
            rel = Path(root, name).relative_to(folder).as_posix()
            if not os.path.islink(os.path.join(root, name)) and rel not in prefixes:
                return rel + "/"
    return None


def check_output_folder(out: Path, overwrite: bool, source: Path | None = None) -> None:
    """Check that ``out`` can receive an export before any work is done.

    ``out`` may be missing (its nearest existing parent must be a writable folder) or an empty folder;
    with ``overwrite``, it may also be an earlier export whose ``export.json`` lists every file in the
    folder, which is replaced. Nothing else is ever deleted.

    Raises:
        InputError: ``out`` is a file or lies under one; its parent is not writable; it is ``source``
            (the model folder) or contains or lies inside it; it is not empty and ``overwrite`` is
            False; or ``overwrite`` is given for a folder holding anything an export did not write
            (the message names the first such file).
    """
    out = Path(out)
    if source is not None:
        a, b = out.resolve(), Path(source).resolve()
        if a == b or a in b.parents or b in a.parents:
            raise InputError(f"output folder {out} overlaps the model folder {source}; choose another --output")
    if not out.exists():
        _check_creatable(out)
        return
    if not out.is_dir():
        raise InputError(f"output path {out} is a file, not a folder")
    if not os.access(out.parent if str(out.parent) else Path("."), os.W_OK | os.X_OK):
        raise InputError(f"cannot write the output folder {out}: its parent folder is not writable")
    if not any(out.iterdir()):
        return
    if not overwrite:
        raise InputError(f"output folder {out} exists and is not empty (pass --overwrite to replace an earlier export)")
    manifest_path = out / MANIFEST_NAME
    if not manifest_path.is_file():
        raise InputError(f"--overwrite replaces earlier exports only: {out} has no {MANIFEST_NAME}, so it is left alone")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError):
        manifest = None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), list):
        raise InputError(
            f"--overwrite replaces earlier exports only: {manifest_path} does not list the files an export wrote, "
            f"so {out} is left alone (remove it yourself if it is yours)"
        )
    foreign = first_foreign_entry(out, manifest)
    if foreign is not None:
        raise InputError(
            f"--overwrite replaces earlier exports only: {out} holds {foreign}, which the export there did not write, "
            "so nothing is deleted"
        )


def _check_creatable(out: Path) -> None:
    """``out`` does not exist: its nearest existing ancestor must be a folder this process may write."""
    ancestor = out.absolute().parent
    while not ancestor.exists():
        if ancestor.is_symlink():
            raise InputError(f"cannot create the output folder {out}: {ancestor} is a broken symbolic link")
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise InputError(f"cannot create the output folder {out}: {ancestor} is a file, not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise InputError(f"cannot create the output folder {out}: {ancestor} is not writable")


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_staging(parent: Path) -> list[Path]:
    """Remove staging folders in ``parent`` left by processes that no longer run; return them.

    Only folders named ``.<name>.tmp-<pid>-<hex>`` that hold the :data:`STAGING_MARKER` file with the
    same pid are touched."""
    removed = []
    try:
        entries = list(parent.iterdir())
    except OSError:
        return removed
    for entry in entries:
        match = _STAGING_NAME.match(entry.name)
        if not match or entry.is_symlink() or not entry.is_dir():
            continue
        try:
            owner = int((entry / STAGING_MARKER).read_text().strip())
        except (OSError, ValueError):
            continue
        if owner != int(match.group(1)) or _pid_alive(owner):
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry)
    return removed


@contextlib.contextmanager
def staged_folder(out: Path, manifest: dict[str, Any]) -> Iterator[Path]:
    """Yield a staging folder beside ``out``; when the block ends, write ``manifest`` (filled in by the
    block, its ``files`` set here to every file written) as ``export.json`` there and move the folder into
    place, replacing ``out``. When the block raises (an interrupt included), the staging folder and any
    parent folder created for ``out`` are removed and ``out`` is left as it was.

    Raises:
        InputError: the staging folder cannot be created (the message names the path and the reason),
            or ``out`` changed while the export ran so that it is no longer safe to replace.
    """
    out = Path(out)
    created = _missing_parents(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_staging(out.parent)
        staging = out.parent / f".{out.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
        staging.mkdir(mode=0o700)
        (staging / STAGING_MARKER).write_text(f"{os.getpid()}\n")
    except OSError as error:
        _remove_empty(created)
        raise InputError(f"cannot write the output folder {out}: {error.strerror or error}") from error
    try:
        yield staging
        interrupts.check()
        manifest["files"] = written_files(staging) + [MANIFEST_NAME]
        (staging / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
        (staging / STAGING_MARKER).unlink()
        _make_readable(staging)
        interrupts.check()
        _replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        _remove_empty(created)
        raise


def _replace(staging: Path, out: Path) -> None:
    """Move ``staging`` to ``out``; an existing ``out`` (checked again now) is moved aside first and
    removed only once the new folder is in place."""
    if not out.exists() and not out.is_symlink():
        os.replace(staging, out)
        return
    check_output_folder(out, overwrite=True)
    aside = out.parent / f".{out.name}.old-{os.getpid()}-{secrets.token_hex(4)}"
    os.replace(out, aside)
    try:
        os.replace(staging, out)
    except BaseException:
        os.replace(aside, out)
        raise
    shutil.rmtree(aside, ignore_errors=True)


def _missing_parents(out: Path) -> list[Path]:
    """The ancestors of ``out`` that do not exist yet, deepest first."""
    missing = []
    parent = out.absolute().parent
    while not parent.exists() and parent != parent.parent:
        missing.append(parent)
        parent = parent.parent
    return missing


def _remove_empty(folders: list[Path]) -> None:
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


def _make_readable(folder: Path) -> None:
    """Give ``folder`` (created private) the permissions a new folder gets under the umask."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
