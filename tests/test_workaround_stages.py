"""A workaround's stage is declared once, where it is registered: ``hf-exporters patches`` shows it,
and each exporter applies the workaround in that stage and in no other.

The exports below record, for every workaround an exporter selects, the exporter stage that was
running (the ``stage`` blocks of the exporters' ``export()``), without installing any patch: a tiny
module needs none. Patches are recorded where the registry would install them, fixes, translations
and IR fixes where the registry selects them, backend preparers when they are called.
"""

import contextlib
import json
import re
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from hf_exporters import registry
from hf_exporters.cli import app
from hf_exporters.config import ExecutorchConfig
from hf_exporters.exporters import dynamo as dynamo_exporter
from hf_exporters.exporters import executorch as executorch_exporter
from hf_exporters.exporters import onnx as onnx_exporter

ROOT = Path(__file__).resolve().parent.parent
#: the backend scopes the exports below exercise (``executorch.cuda`` needs a GPU; ``load.pt2`` is no export)
EXERCISED = {"dynamo", "onnx", "executorch", "executorch.xnnpack", "executorch.portable"}


class _Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x).relu()


def _listing() -> dict[tuple[str, str, str, str], str]:
    """``hf-exporters patches --json``: {(backend, kind, target, name): stage}."""
    result = CliRunner().invoke(app, ["patches", "--json"])
    assert result.exit_code == 0, result.output
    return {(r["backend"], r["kind"], r["target"], r["name"]): r["stage"] for r in json.loads(result.output)}


class _Recorder:
    """Which exporter stage selects each workaround: {(backend, kind, target, name): {stage titles}}."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.stage: str | None = None
        self.scope: str | None = None  # the backend of the patches being installed
        self.applied: dict[tuple[str, str, str, str], set[str | None]] = {}
        real_select = registry._select

        def select(kind, backend, *args, **kwargs):
            chosen = real_select(kind, backend, *args, **kwargs)
            if kind == "patch":
                self.scope = backend  # recorded path by path, where each would be installed
            else:
                for workaround in chosen:
                    self._record(workaround)
            return chosen

        def install(path, workaround):
            self._record_patch(path, workaround.name)
            return None  # not installed

        def loaded_matches(path):
            self._record_patch(path, None)
            return []

        monkeypatch.setattr(registry, "_select", select)
        monkeypatch.setattr(registry, "_install", install)
        monkeypatch.setattr(registry, "_module_loaded", lambda path: True)  # every model-method patch is reached
        monkeypatch.setattr(registry, "_loaded_matches", loaded_matches)
        for module in (dynamo_exporter, onnx_exporter, executorch_exporter):
            monkeypatch.setattr(module, "stage", self._stage(module.stage))
        for name, prepare in list(registry._BACKEND_PREPARE.items()):
            monkeypatch.setitem(registry._BACKEND_PREPARE, name, self._prepare(name, prepare))

    def _stage(self, real):
        @contextlib.contextmanager
        def stage(exporter, title, *timing):
            outer, self.stage = self.stage, title
            try:
                with real(exporter, title, *timing):
                    yield
            finally:
                self.stage = outer

        return stage

    def _prepare(self, name, prepare):
        def recorded(model, inputs):
            self.applied.setdefault((f"executorch.{name}", "backend_prepare", name, prepare.__name__), set()).add(self.stage)
            return prepare(model, inputs)

        return recorded

    def _record(self, workaround):
        key = (workaround.backend, workaround.kind, workaround.target, workaround.name)
        self.applied.setdefault(key, set()).add(self.stage)

    def _record_patch(self, target, name):
        scopes = set(registry._scopes(self.scope))
        (workaround,) = [
            w
            for w in registry.list_workarounds()
            if w.kind == "patch" and w.backend in scopes and w.target == target and name in (None, w.name)
        ]
        self._record(workaround)


def test_every_workaround_is_applied_in_the_stage_the_listing_shows(monkeypatch: pytest.MonkeyPatch) -> None:
    listing = _listing()
    recorder = _Recorder(monkeypatch)
    inputs = {"x": torch.randn(2, 3, 8)}
    dynamo_exporter.DynamoExporter().export(_Tiny().eval(), inputs)
    onnx_exporter.OnnxExporter().export(_Tiny().eval(), inputs)
    for backend in ("xnnpack", "portable"):
        executorch_exporter.ExecutorchExporter().export(_Tiny().eval(), inputs, ExecutorchConfig(backend=backend))

    applied = recorder.applied
    assert set(applied) <= set(listing)
    mismatched = {
        f"{backend}:{name} ({target})": (listing[key], sorted(map(str, stages)))
        for key, stages in applied.items()
        for backend, _kind, target, name in [key]
        if stages != {listing[key]}
    }
    assert mismatched == {}
    never = sorted(f"{b}:{n} ({t})" for (b, k, t, n) in listing if b in EXERCISED and (b, k, t, n) not in applied)
    assert never == []


def _code_stages(exporter: str) -> list[str]:
    source = (ROOT / "src/hf_exporters/exporters" / f"{exporter}.py").read_text()
    return re.findall(r"# ── (Stage \d+: [^─\n]+?) ──", source)


@pytest.mark.parametrize("backend", ["dynamo", "onnx", "executorch"])
def test_registry_stages_are_the_exporters_stage_blocks(backend: str) -> None:
    """The stage a workaround declares is one of the stage blocks of its backend's exporter."""
    assert set(registry.STAGES[backend]) <= set(_code_stages(backend))
