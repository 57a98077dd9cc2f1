"""ExecutorchExporter Stage 5: FX node fixes (``register_fx_node_fix("executorch...")``).

Rewrites of single nodes of the traced graph into ops ExecuTorch can lower and run.
"""

from __future__ import annotations
