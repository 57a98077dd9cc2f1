"""One copy of the weights for the ONNX graphs of a generation folder.

Each part of an ONNX generation folder (prefill and decode, encoder and decoder, an image encoder) is
exported as its own graph with its own initializers, and most of them are the same tensors: a decoder's
prefill and decode graphs hold the whole model twice. onnxruntime reads a graph's external data only from
its own directory or below (a ``location`` with ``..`` is refused), so the parts cannot keep one subfolder
each and point at one file. :func:`share_weights` moves every part's graph to the folder's root as
``<part>.onnx`` and stores each distinct initializer of :data:`INLINE_BYTES` or more once in
``model.onnx.data`` beside them (same dtype, shape and bytes: one copy, whatever its name); smaller
ones stay inside their graph.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path

#: the file every part's large initializers are stored in, at the folder's root
SHARED_DATA = "model.onnx.data"

#: initializers smaller than this (bytes) stay inside their graph
INLINE_BYTES = 1024

#: each tensor starts at a multiple of this (bytes) in :data:`SHARED_DATA`
ALIGNMENT = 64


def share_weights(
    root: Path, files: Mapping[str, str], check: Callable[[str, Path, Path], None] | None = None
) -> dict[str, list[str]]:
    """Rewrite the ONNX graphs ``files`` (``{part: path relative to root}``, each possibly with its own
    external data beside it) as ``root/<part>.onnx`` sharing ``root/model.onnx.data``.

    ``check(part, old, new)`` runs once every new graph is written, before the old ones are removed (it
    raises to stop; the old files then stay and the new ones are removed). Returns ``{part: files it
    needs, relative to root}``; the old files and the subfolders they leave empty are removed.

    Raises:
        ValueError: a part's new file name is one of the old files, two parts would share a name, or
            ``root`` already has a ``model.onnx.data``.
    """
    import onnx

    targets = {part: f"{part}.onnx" for part in files}
    if len(set(targets.values())) != len(targets) or set(targets.values()) & set(files.values()):
        raise ValueError(f"the parts {sorted(files)} cannot each take a root file named after them")
    data_path = root / SHARED_DATA
    if data_path.exists():
        raise ValueError(f"{root} already has a {SHARED_DATA}")
    stored: dict[tuple[int, tuple[int, ...], bytes], tuple[int, int]] = {}  # (dtype, dims, digest) -> (offset, length)
    written: list[Path] = []
    temporary = root / (SHARED_DATA + ".tmp")
    try:
        with open(temporary, "wb") as data:
            for part, file in files.items():
                model = onnx.load(str(root / file))  # with its external data, if any
                for tensor in _initializers(model.graph):
                    if tensor.data_location == onnx.TensorProto.EXTERNAL or len(tensor.raw_data) < INLINE_BYTES:
                        continue
                    key = (tensor.data_type, tuple(tensor.dims), hashlib.blake2b(tensor.raw_data, digest_size=20).digest())
                    if key not in stored:
                        offset = -data.tell() % ALIGNMENT + data.tell()
                        data.seek(offset)
                        data.write(tensor.raw_data)
                        stored[key] = (offset, len(tensor.raw_data))
                    offset, length = stored[key]
                    tensor.ClearField("raw_data")
                    tensor.data_location = onnx.TensorProto.EXTERNAL
                    del tensor.external_data[:]
                    for k, v in (("location", SHARED_DATA), ("offset", str(offset)), ("length", str(length))):
                        entry = tensor.external_data.add()
                        entry.key, entry.value = k, v
                target = root / targets[part]
                target.write_bytes(model.SerializeToString())
                written.append(target)
        old_data = {root / f: _external_files(root / f) for f in files.values()}
        temporary.replace(data_path)
        written.append(data_path)
        if check is not None:
            for part, file in files.items():
                check(part, root / file, root / targets[part])
    except BaseException:
        for path in written:
            path.unlink(missing_ok=True)
        temporary.unlink(missing_ok=True)
        raise
    for graph, externals in old_data.items():
        for path in [graph, *externals]:
            if path != data_path:
                path.unlink(missing_ok=True)
        folder = graph.parent
        if folder != root and folder.is_dir() and not any(folder.iterdir()):
            shutil.rmtree(folder)
    return {part: [targets[part], SHARED_DATA] for part in files}


def _initializers(graph: object) -> list[object]:
    """Every initializer of ``graph`` (an ``onnx.GraphProto``) and of the graphs nested in its nodes."""
    out = list(graph.initializer)  # type: ignore[attr-defined]
    for node in graph.node:  # type: ignore[attr-defined]
        for attribute in node.attribute:
            out.extend(t for g in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs) for t in _initializers(g))
    return out


def _external_files(graph_path: Path) -> list[Path]:
    """The external data files ``graph_path`` names (without loading them)."""
    import onnx

    model = onnx.load(str(graph_path), load_external_data=False)
    names = {e.value for t in _initializers(model.graph) for e in t.external_data if e.key == "location"}  # type: ignore[attr-defined]
    return [graph_path.parent / name for name in sorted(names)]


__all__ = ["ALIGNMENT", "INLINE_BYTES", "SHARED_DATA", "share_weights"]
