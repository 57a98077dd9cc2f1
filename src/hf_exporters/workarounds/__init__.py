"""Every built-in workaround. Importing this package registers them.

One package per backend (``dynamo``, applied by every exporter; ``onnx``; ``executorch``) and, in
each, one module per pattern family or per kind of internals patched. Each workaround declares the
exporter stage that applies it where it is registered (``register_patch(..., stage=...)``, or the
backend's one stage for its kind), so a module may hold workarounds of several stages;
``hf-exporters patches`` lists them with their stage.
"""

from . import dynamo as _dynamo  # noqa: F401
from . import executorch as _executorch  # noqa: F401
from . import onnx as _onnx  # noqa: F401
