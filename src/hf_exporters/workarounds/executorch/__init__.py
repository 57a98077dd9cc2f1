"""ExecutorchExporter workarounds. Importing this package registers them.

Each workaround declares its stage where it is registered; the modules:

- ``backends``: Stage 1, backend preparation (``prepare_for_<name>``).
- ``torch_patches``: Stage 2, torch ops the ExecuTorch backends reject, rewritten in core ATen ops.
- ``complex_numbers``: Stage 2, model code computing in complex numbers (rotary tables, FNet's FFT).
- ``moe``: Stage 2, transformers' experts implementations ExecuTorch cannot run.
- ``reduced_precision``: Stage 2, float16 and bfloat16 normalisations computed in float32.
- ``executorch_patches``: Stage 3, ExecuTorch internals that break on valid dynamic-shape graphs.
- ``decomposition_layouts``: Stage 3, views a decomposition's output layout no longer allows, re-traced as reshapes.
- ``mutable_buffers``: Stage 3, mutated buffers whose initial value the program reads, kept in the program.
- ``lowering_speed``: Stage 3, lowering steps skipped where they would find nothing to do (pinned to executorch 1.4).
- ``xnnpack_partitions``: Stage 3, decompositions that keep attention and LayerNorm inside XNNPACK partitions.
- ``xnnpack_layout``: Stage 3, operators XNNPACK's channels-last layout pass must give their input in NCHW, and
  ``prelu`` claimed over 4-D inputs only.
- ``xnnpack_outputs``: Stage 3, partition outputs XNNPACK cannot number twice, given a copy each.
- ``fx_program_fixes``: Stage 4, repairs of the whole traced program.
- ``fx_node_fixes``: Stage 5, single-node rewrites.
"""

from . import backends as _backends  # noqa: F401
from . import complex_numbers as _complex_numbers  # noqa: F401
from . import decomposition_layouts as _decomposition_layouts  # noqa: F401
from . import executorch_patches as _executorch_patches  # noqa: F401
from . import fx_node_fixes as _fx_node_fixes  # noqa: F401
from . import fx_program_fixes as _fx_program_fixes  # noqa: F401
from . import moe as _moe  # noqa: F401
from . import mutable_buffers as _mutable_buffers  # noqa: F401
from . import lowering_speed as _lowering_speed  # noqa: F401
from . import reduced_precision as _reduced_precision  # noqa: F401
from . import torch_patches as _torch_patches  # noqa: F401
from . import xnnpack_layout as _xnnpack_layout  # noqa: F401
from . import xnnpack_outputs as _xnnpack_outputs  # noqa: F401
from . import xnnpack_partitions as _xnnpack_partitions  # noqa: F401
