"""The CI smoke sweep: about 20 classes across families, and the baseline of their expected outcomes (keys of
:func:`~.runner.job_key`, cache kinds included)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: family -> base model classes (one per model type) chosen to cover it
SMOKE_CLASSES: dict[str, list[str]] = {
    "encoder": ["BertModel", "RobertaModel", "DistilBertModel"],
    "decoder": ["LlamaModel", "GPT2Model", "Qwen2Model", "Gemma2Model"],
    "encoder-decoder": ["T5Model", "BartModel"],
    "vision": ["ViTModel", "ResNetModel", "SwinModel"],
    "audio": ["WhisperModel", "Wav2Vec2Model"],
    "multimodal": ["CLIPModel", "SiglipModel"],
    "mixture-of-experts": ["MixtralModel", "Qwen2MoeModel"],
    "state-space": ["MambaModel", "Mamba2Model"],
    "hybrid": ["Lfm2Model"],
}
#: classes with a ``use_cache`` field whose ``default`` cache kind (the model's cache returned and compared) the smoke
#: sweep runs, beside their ``off`` kind: a sliding-window decoder (Gemma2: sliding and full attention layers) and a
#: hybrid decoder (LFM2: convolution and attention layers). The other classes with the field run ``off`` only; a
#: class without the field runs its one job, of kind ``default``.
SMOKE_DEFAULT_CACHE = ("Gemma2Model", "Lfm2Model")
BASELINE = Path(__file__).with_name("smoke_baseline.json")


def smoke_classes() -> list[str]:
    return [c for classes in SMOKE_CLASSES.values() for c in classes]


def load_baseline(path: Path = BASELINE) -> dict[str, str]:
    """``{job key: expected outcome}``."""
    return json.loads(path.read_text())["expected"] if path.exists() else {}


def write_baseline(records: list[dict[str, Any]], path: Path = BASELINE) -> None:
    """Set the expected outcome of every job in ``records``; the baseline's other entries (jobs this run did not
    run, such as a run with ``--only``) are kept."""
    expected = load_baseline(path)
    expected.update({r["key"]: r["outcome"] for r in records})
    path.write_text(json.dumps({"comment": "written by `hf-exporters sweep --smoke --update-baseline`", "expected": dict(sorted(expected.items()))}, indent=2) + "\n")


def regressions(records: list[dict[str, Any]], baseline: dict[str, str], planned: set[str] | None = None) -> list[str]:
    """Jobs the baseline expects to pass that did not, or that passed without the signal rule's verdict.

    ``records``: the latest record of each job at the run's revision. A job the baseline expects to pass fails
    the smoke sweep when its record is not a pass (a ``degenerate model`` included), when a forward job's pass
    carries no ``signal`` verdict or one that is not ok (:mod:`~.signal_check`: a pass on outputs without
    signal is vacuous), or, among ``planned`` keys, when it has no record (not run)."""
    got = {r["key"]: r for r in records}
    out = []
    for key, expected in sorted(baseline.items()):
        record = got.get(key)
        if expected != "pass":
            continue
        if record is None:
            if planned is not None and key in planned:
                out.append(f"{key}: expected pass, not run")
            continue
        if record["outcome"] != "pass":
            out.append(f"{key}: expected pass, got {record['outcome']} at {record.get('stage')}: {record.get('message')}")
        elif record.get("mode", "forward") != "generation" and not (record.get("signal") or {}).get("ok"):
            out.append(f"{key}: passed without the signal check's verdict (outputs carrying signal): {record.get('signal')}")
    return out
