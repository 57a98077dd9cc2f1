"""Errors raised by hf-exporters.

Every error a user can hit derives from :class:`HfExportersError`, so the CLI can print one clear
line and exit non-zero without a traceback.
"""

from __future__ import annotations


class HfExportersError(Exception):
    """Base class of every error hf-exporters raises on purpose."""


class MissingDependencyError(HfExportersError, ImportError):
    """An optional backend library is not installed.

    The message names the package and the extra that installs it, e.g.
    ``pip install 'hf-exporters[onnx]'``.
    """

    def __init__(self, package: str, extra: str, purpose: str):
        self.package = package
        self.extra = extra
        super().__init__(
            f"{purpose} needs the package '{package}', which is not installed. "
            f"Install it with: pip install 'hf-exporters[{extra}]'"
        )


class ExportStageError(HfExportersError):
    """An exporter stage failed.

    Attributes:
        exporter: the exporter's name (``"dynamo"``, ``"onnx"``, ``"executorch"``).
        stage: the stage's number and title as in ``docs/extending.md`` (e.g. ``"Stage 2: Model patches"``),
            or a named step outside the stage blocks (``"trace"``, ``"lowering"``).
        blamed: ``"file:line"`` of the model source line torch.export blamed, when it named one.
    """

    def __init__(self, exporter: str, stage: str, message: str, blamed: str | None = None):
        self.exporter = exporter
        self.stage = stage
        self.blamed = blamed
        self.detail = message
        text = f"[{exporter}] {stage} failed: {message}"
        if blamed:
            text += f"\n  blamed source line: {blamed}"
        super().__init__(text)


class ParityError(HfExportersError):
    """The exported artifact's outputs differ from eager PyTorch by more than the tolerance."""


class InputError(HfExportersError):
    """The model folder, its config or the requested task/backend cannot be used."""


class ManifestError(HfExportersError):
    """An artifact folder's ``export.json`` is missing, unreadable or inconsistent."""


class CppRunnerError(HfExportersError):
    """The C++ runner (``runtime="cpp"``) is not built, or it refused a folder, a file or an input.

    The message is the runner's own one-line error (``make cpp`` builds the runner).
    """


class ArtifactRunError(HfExportersError):
    """An exported artifact loaded but its runtime failed while running it (a truncated weights file,
    a kernel that refused its inputs). The message names the part, the file and the runtime's error."""


class BrokenModelError(InputError):
    """Eager PyTorch itself returns NaN or infinity where the exported artifact is compared with it:
    the model or its checkpoint is broken (NaN weights, an overflowing dtype), not the export."""
