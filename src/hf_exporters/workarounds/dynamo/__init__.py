"""DynamoExporter workarounds, one module per pattern family. Importing this package registers them.

Every patch here is registered for ``"dynamo"`` and applied in DynamoExporter's Stage 2 (Model
patches), which the ONNX and ExecuTorch exporters run too: they trace through DynamoExporter.

- ``attention``: attention implementations (SDPA without length branches, packed-sequence and
  windowed attention as one masked SDPA call).
- ``masks``: attention-mask builders (transformers' ``masking_utils``, model-specific masks).
- ``symbolic_shapes``: torch's symbolic-shape reasoning on dynamic sizes (constraint solver, floor
  division, ``len(tensor)``).
- ``fake_tensors``: torch's own Python code that does not run on fake tensors (``Module.to``,
  ``torch.distributions`` validation).
- ``moe``: mixture-of-experts loops over the experts the router picked.
- ``recurrences``: Python loops over the sequence (selective scans, RG-LRU, RWKV, LSTM/GRU).
- ``vision``: vision towers that read per-image sizes from data (``grid_thw`` and kin).
- ``audio``: audio codecs and speech models (conv padding buffers, frame loops, durations).
- ``positions``: position embeddings and relative positions of a symbolic length.
- ``load_patches``: not an export stage; patches for reading a saved ``model.pt2`` back
  (``"load.pt2"``, applied by ``load_exported_program``).
"""

from . import attention as _attention  # noqa: F401
from . import audio as _audio  # noqa: F401
from . import fake_tensors as _fake_tensors  # noqa: F401
from . import load_patches as _load_patches  # noqa: F401
from . import masks as _masks  # noqa: F401
from . import moe as _moe  # noqa: F401
from . import positions as _positions  # noqa: F401
from . import recurrences as _recurrences  # noqa: F401
from . import symbolic_shapes as _symbolic_shapes  # noqa: F401
from . import vision as _vision  # noqa: F401
