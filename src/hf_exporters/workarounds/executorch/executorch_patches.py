"""ExecutorchExporter Stage 3: ExecuTorch patches (``register_patch("executorch...", "executorch.<path>")``).

Active during ``to_edge_transform_and_lower`` and ``to_executorch``: ExecuTorch internals that break
on valid dynamic-shape graphs.
"""

from __future__ import annotations
