"""Model classes the exporters handle differently because of an upstream bug, each with its reason.

Every entry names the upstream report (``owner/repo#N`` or a URL) and is expected to go when that
report is fixed; a test refuses an entry without one.
"""

from __future__ import annotations

#: model class name -> the upstream onnxscript optimizer bug that forces ``OnnxConfig.optimize`` off
ONNX_DISABLE_OPTIMIZE: dict[str, str] = {}

#: ``(backend, model class name)`` -> why that export is skipped (an upstream reference)
EXPORT_SKIPS: dict[tuple[str, str], str] = {}
