"""docs/extending.md's stage reference equals the stage blocks in each exporter's source; every
registered workaround documents its upstream report and removal condition."""

import re
from pathlib import Path

import pytest

import hf_exporters
from hf_exporters.registry import list_workarounds

ROOT = Path(__file__).resolve().parent.parent
EXPORTERS = {"dynamo": "dynamo.py", "onnx": "onnx.py", "executorch": "executorch.py"}


def _code_stages(name):
    source = (ROOT / "src/hf_exporters/exporters" / EXPORTERS[name]).read_text()
    return re.findall(r"# ── (Stage \d+: [^─\n]+?) ──", source)


def _doc_stages(name):
    text = (ROOT / "docs/extending.md").read_text()
    section = re.search(rf"^### {name} \(.*?\)\n(.*?)(?=^### |\Z)", text, flags=re.MULTILINE | re.DOTALL)
    assert section, f"docs/extending.md has no '### {name}' section"
    return re.findall(r"^- (Stage \d+: .+?) —", section.group(1), flags=re.MULTILINE)


@pytest.mark.parametrize("name", list(EXPORTERS))
def test_stage_reference_matches_code(name):
    if not (ROOT / "src/hf_exporters/exporters" / EXPORTERS[name]).exists():
        pytest.fail(f"exporter {name} missing")
    code = _code_stages(name)
    assert code == [f"Stage {i}: {t.split(': ', 1)[1]}" for i, t in enumerate(code, start=1)]  # numbered 1..N in order
    assert len(code) == {"onnx": 7}.get(name, 5)  # onnx: Stage 6 fusions and Stage 7 quantization
    assert _doc_stages(name) == code


def _all_workarounds():
    import hf_exporters.workarounds  # noqa: F401

    assert hf_exporters
    return list_workarounds()


def test_every_workaround_names_upstream_and_removal():
    missing = [
        f"{w.backend}:{w.name}"
        for w in _all_workarounds()
        if w.kind != "backend_prepare" and (not w.upstream or not w.remove_when)
    ]
    assert missing == []


def test_workaround_names_follow_the_prefixes():
    prefixes = {
        "patch": "_patch_",
        "fx_node_fix": "_fix_",
        "fx_program_fix": "_fix_",
        "onnx_translation": "_aten_",
        "onnx_ir_fix": "_fix_ir_",
        "backend_prepare": "prepare_for_",
    }
    wrong = [f"{w.kind}:{w.name}" for w in _all_workarounds() if not w.name.startswith(prefixes[w.kind])]
    assert wrong == []


def test_every_workaround_is_applied_by_a_stage():
    assert [w.name for w in _all_workarounds() if w.stage.startswith("unused")] == []


def test_every_workaround_module_says_which_pattern_it_handles():
    import importlib

    modules = {w.func.__module__ for w in _all_workarounds() if w.func.__module__.startswith("hf_exporters.workarounds.")}
    undocumented = sorted(m for m in modules if len((importlib.import_module(m).__doc__ or "").split()) < 10)
    assert undocumented == []
