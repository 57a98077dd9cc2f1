"""ExecutorchExporter workarounds, one module per stage. Importing this package registers them."""

from . import backends as _backends  # noqa: F401
from . import executorch_patches as _executorch_patches  # noqa: F401
from . import fx_node_fixes as _fx_node_fixes  # noqa: F401
from . import fx_program_fixes as _fx_program_fixes  # noqa: F401
from . import torch_patches as _torch_patches  # noqa: F401
