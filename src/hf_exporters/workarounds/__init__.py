"""Every built-in workaround, one module per (backend, stage). Importing this package registers them."""

from .dynamo import load_patches as _dynamo_load_patches  # noqa: F401
from .dynamo import model_patches as _dynamo_model_patches  # noqa: F401
from . import executorch as _executorch  # noqa: F401
from . import onnx as _onnx  # noqa: F401
