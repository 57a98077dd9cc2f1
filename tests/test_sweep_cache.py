"""The sweep's cache kinds: ``default`` (the model's own ``use_cache``, its cache returned and compared) and ``off``."""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from typer.testing import CliRunner  # noqa: E402

from hf_exporters.cli import app  # noqa: E402
from hf_exporters.sweep import report, runner, smoke  # noqa: E402
from hf_exporters.sweep.job import CACHE_KINDS, class_has_use_cache, run_job  # noqa: E402

# ── Which classes run which kinds ────────────────────────────────────────────


def test_classes_with_a_use_cache_field_are_found_in_their_configs() -> None:
    assert class_has_use_cache("LlamaModel") is True
    # a composite config whose text config is built through AutoConfig: found on the built config
    assert class_has_use_cache("LlavaModel") is True
    assert class_has_use_cache("ViTModel") is False
    assert class_has_use_cache("NoSuchModelClass") is False


def test_the_plan_runs_both_kinds_only_for_classes_with_use_cache() -> None:
    fields = {"LlamaModel": True, "ViTModel": False}
    kinds = runner.cache_kinds_for(["off", "default"], fields.__getitem__)
    specs = runner.plan([("LlamaModel", "llama"), ("ViTModel", "vit")], ["onnx"], ["ours", "upstream"], [False, True], cache_kinds=kinds)
    assert [runner.job_key(s) for s in specs] == [
        "ours|onnx|static|LlamaModel|cache=default",
        "upstream|onnx|static|LlamaModel|cache=default",
        "ours|onnx|static|LlamaModel",
        "upstream|onnx|static|LlamaModel",
        "ours|onnx|static|ViTModel|cache=default",
        "upstream|onnx|static|ViTModel|cache=default",
        "ours|onnx|dynamic|LlamaModel|cache=default",
        "upstream|onnx|dynamic|LlamaModel|cache=default",
        "ours|onnx|dynamic|LlamaModel",
        "upstream|onnx|dynamic|LlamaModel",
        "ours|onnx|dynamic|ViTModel|cache=default",
        "upstream|onnx|dynamic|ViTModel|cache=default",
    ]
    assert [s["cache"] for s in specs[:6]] == ["default", "default", "off", "off", "default", "default"]
    # one kind asked: off runs the classes with the field only, default every class
    assert [runner.job_key(s) for s in runner.plan([("LlamaModel", "llama"), ("ViTModel", "vit")], ["onnx"], ["ours"], [False],
                                                   cache_kinds=runner.cache_kinds_for(["off"], fields.__getitem__))] == ["ours|onnx|static|LlamaModel"]
    # the smoke set: the default kind of the classes with the field it names only
    smoke_kinds = runner.cache_kinds_for(list(CACHE_KINDS), {"Gemma2Model": True, "LlamaModel": True, "ViTModel": False}.__getitem__, ("Gemma2Model",))
    assert (smoke_kinds("Gemma2Model"), smoke_kinds("LlamaModel"), smoke_kinds("ViTModel")) == (["default", "off"], ["off"], ["default"])
    # generation jobs have no cache kind in their spec or key
    generation = runner.plan([("LlamaForCausalLM", "llama")], ["onnx"], ["ours"], ["generation"], cache_kinds=kinds)
    assert [runner.job_key(s) for s in generation] == ["ours|onnx|generation|LlamaForCausalLM"] and "cache" not in generation[0]
    assert runner.job_key({**specs[0], "backend": "executorch", "runtime": "cpp"}) == "ours|executorch|static|LlamaModel|cache=default|cpp"


def test_the_smoke_set_runs_a_sliding_window_and_a_hybrid_decoder_with_their_cache() -> None:
    assert smoke.SMOKE_DEFAULT_CACHE == ("Gemma2Model", "Lfm2Model")
    assert set(smoke.SMOKE_DEFAULT_CACHE) <= set(smoke.smoke_classes())
    baseline = smoke.load_baseline()
    for cls in smoke.SMOKE_DEFAULT_CACHE:
        for backend in ("dynamo", "onnx", "executorch"):
            assert f"ours|{backend}|static|{cls}|cache=default" in baseline
            assert f"ours|{backend}|static|{cls}" in baseline


def test_the_smoke_baseline_has_an_entry_for_every_job_of_the_smoke_plan_and_no_other() -> None:
    """``make smoke``'s plan (static, three backends, our engine, both cache kinds asked) and the baseline name the
    same jobs: a planned job without an entry would go unchecked, an entry no plan makes would never run."""
    kinds = runner.cache_kinds_for(list(CACHE_KINDS), class_has_use_cache, smoke.SMOKE_DEFAULT_CACHE)
    specs = runner.plan([(c, "") for c in smoke.smoke_classes()], ["dynamo", "onnx", "executorch"], ["ours"], [False], cache_kinds=kinds)
    assert sorted(runner.job_key(s) for s in specs) == sorted(smoke.load_baseline())


def test_update_baseline_keeps_the_entries_of_jobs_not_run(tmp_path: Path) -> None:
    path = tmp_path / "baseline.json"
    smoke.write_baseline([{"key": "ours|onnx|static|A", "outcome": "pass"}, {"key": "ours|onnx|static|B", "outcome": "pass"}], path)
    smoke.write_baseline([{"key": "ours|onnx|static|B|cache=default", "outcome": "fail"}], path)
    assert smoke.load_baseline(path) == {
        "ours|onnx|static|A": "pass", "ours|onnx|static|B": "pass", "ours|onnx|static|B|cache=default": "fail",
    }


# ── Records written before cache kinds ───────────────────────────────────────


def test_records_without_a_cache_kind_read_back_as_cache_off(tmp_path: Path) -> None:
    old = {"key": "ours|onnx|static|LlamaModel", "engine": "ours", "backend": "onnx", "dynamic": False, "model_class": "LlamaModel",
           "outcome": "pass", "versions": {"torch": "x"}, "revision": "r1"}
    assert (report.cache_of(old), runner.cache_label(old)) == ("off", "off")
    assert report.cache_of({**old, "mode": "generation"}) == "default"
    store = runner.ResultStore(tmp_path / "results.jsonl", {"torch": "x"}, "r1")
    store.append(old)
    kinds = runner.cache_kinds_for(list(CACHE_KINDS), lambda c: True)
    specs = runner.plan([("LlamaModel", "llama")], ["onnx"], ["ours"], [False], cache_kinds=kinds)
    # resume: the old record is the off kind's job; the default kind is still to run
    assert [runner.job_key(s) for s in specs if runner.job_key(s) not in store.done()] == ["ours|onnx|static|LlamaModel|cache=default"]
    summary = report.summarize(store.records(), {}, {"forward": ["LlamaModel"], "generation": []})
    assert list(summary["groups"]) == ["ours|onnx|static|off"]
    assert summary["groups"]["ours|onnx|static|off"]["pass"] == 1


# ── The report: both kinds, the headline the default kind's ──────────────────


def _record(cls: str, cache: str | None, outcome: str, stage: str | None = None) -> dict:
    record = {
        "key": f"ours|onnx|static|{cls}" + ("|cache=default" if cache == "default" else ""), "engine": "ours", "backend": "onnx",
        "dynamic": False, "model_class": cls, "outcome": outcome, "stage": stage, "revision": "r1",
        "kind": "pytree / output type" if outcome == "fail" else None,
        "message": "TypeError: cannot flatten a dict found inside a pytree-registered object" if outcome == "fail" else None,
    }
    if cache is not None:
        record["cache"] = cache
    return record


def test_the_report_shows_both_kinds_and_takes_its_headline_from_the_default_kind(tmp_path: Path) -> None:
    records = [
        _record("Llama", "default", "pass"), _record("Llama", "off", "pass"),
        _record("Lfm2", "default", "fail", "exporter trace"), _record("Lfm2", None, "pass"),  # an old record: off
        _record("ViT", "default", "pass"),
    ]
    selection = {"forward": ["Lfm2", "Llama", "ViT"], "generation": [], "cache": {"default": ["Lfm2", "Llama", "ViT"], "off": ["Lfm2", "Llama"]}}
    summary = report.write_reports(tmp_path, records, {"versions": {"transformers": "x"}}, selection)
    assert summary["headline_cache"] == "default" and summary["cache_classes_selected"] == {"default": 3, "off": 2}
    assert list(summary["groups"]) == ["ours|onnx|static|default", "ours|onnx|static|off"]
    default, off = summary["groups"]["ours|onnx|static|default"], summary["groups"]["ours|onnx|static|off"]
    assert (default["headline"], default["pass"], default["selected"], default["pass_rate"], default["failures_by_stage"]) == (
        True, 2, 3, 0.6667, {"exporter trace": 1})
    assert (off["headline"], off["pass"], off["selected"], off["pass_rate"]) == (False, 2, 2, 1.0)
    text = (tmp_path / "report.md").read_text()
    assert "- Cache kinds: the headline rate is the **cache default** kind's" in text
    assert "Classes planned per kind: default 3, off 2." in text
    assert "| engine | backend | shapes | cache default (headline) | cache off |" in text
    assert "| ours | onnx | static | 2 / 3 (66.7%) | 2 / 2 (100.0%) |" in text
    assert "| ours | onnx | static | default | 2 / 3 | 66.7% | 0 | 1 | 0 | 0 | exporter trace 1 |" in text
    assert "| ours | onnx | static | off | 2 / 2 | 100.0% | 0 | 0 | 0 | 0 |  |" in text
    assert json.loads((tmp_path / "summary.json").read_text())["groups"]["ours|onnx|static|default"]["pass"] == 2


def test_an_unknown_cache_kind_is_one_error_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["sweep", "--cache", "default,on", "--output", str(tmp_path / "out")])
    assert result.exit_code == 1
    assert result.output.strip() == "error: --cache default,on: unknown cache kind on; choose from default, off (comma-separated)"
    assert not (tmp_path / "out").exists()


# ── A real job: the returned cache is compared leaf by leaf ──────────────────


def test_a_decoder_job_of_the_default_kind_compares_its_cache_leaf_by_leaf() -> None:
    cache = [f"past_key_values_{i}" for i in range(4)]  # two layers, keys and values
    record = run_job({"class": "LlamaModel", "backend": "dynamo", "dynamic": False, "cache": "default"})
    assert record["outcome"] == "pass", record
    assert record["use_cache"] == {"": True}
    assert list(record["leaf_diffs"]) == ["last_hidden_state", *cache]
    assert [leaf["name"] for leaf in record["signal"]["leaves"]] == ["last_hidden_state", *cache]
    assert record["signal"]["ok"] and record["signal"]["silent"] == []
    assert all(leaf["max_abs"] >= record["signal"]["floor"] for leaf in record["signal"]["leaves"])
    off = run_job({"class": "LlamaModel", "backend": "dynamo", "dynamic": False, "cache": "off"})
    assert off["outcome"] == "pass", off
    assert (off["use_cache"], list(off["leaf_diffs"])) == ({"": False}, ["last_hidden_state"])
    assert [leaf["name"] for leaf in off["signal"]["leaves"]] == ["last_hidden_state"]


def test_an_unknown_cache_kind_in_a_spec_fails_the_job_before_the_model_is_built() -> None:
    record = run_job({"class": "LlamaModel", "backend": "dynamo", "dynamic": False, "cache": "on"})
    assert (record["outcome"], record["stage"]) == ("fail", "tiny config")
    assert record["message"] == "ValueError: cache kind 'on': choose from default, off"


def test_the_runner_records_the_cache_kind_and_reuses_a_setup_failure_within_a_kind_only(tmp_path: Path) -> None:
    store = runner.ResultStore(tmp_path / "results.jsonl", {}, "r")
    spec = {"class": "NoSuchModelClass", "model_type": "x", "backend": "onnx", "dynamic": False, "engine": "ours"}
    specs = [{**spec, "cache": "default"}, {**spec, "cache": "off"}, {**spec, "backend": "dynamo", "cache": "off"}]
    records = runner.run_jobs(specs, store, progress=False)
    assert [(r["key"], r["cache"], r["stage"], r.get("reused_from")) for r in records] == [
        ("ours|onnx|static|NoSuchModelClass|cache=default", "default", "tiny config", None),
        ("ours|onnx|static|NoSuchModelClass", "off", "tiny config", None),
        ("ours|dynamo|static|NoSuchModelClass", "off", "tiny config", "ours|onnx|static|NoSuchModelClass"),
    ]


def test_the_tiny_lfm2_is_hybrid() -> None:
    """LFM2's default config makes every layer attention; the tiny one keeps a convolution layer beside one attention
    layer, so its default-kind jobs return a hybrid cache (convolution states beside keys and values)."""
    from hf_exporters.sweep import tiny

    config = tiny.tiny_config(__import__("transformers").Lfm2Config)
    assert config.layer_types == ["conv", "full_attention"] and config.num_hidden_layers == 2


def test_an_upstream_job_of_the_default_kind_compares_the_cache_as_upstream_registers_it() -> None:
    record = run_job({"class": "LlamaModel", "backend": "dynamo", "dynamic": False, "cache": "default", "engine": "upstream"})
    assert record["outcome"] == "pass", record
    assert list(record["leaf_diffs"]) == ["last_hidden_state", *(f"past_key_values_{i}" for i in range(4))]


def test_the_signal_check_judges_a_sliding_window_cache_leaf_by_leaf() -> None:
    """Gemma2's returned cache: the sliding layer's keys and values (the last ``window - 1`` tokens), its running
    length (an empty int64 leaf whose first size is the length, and the layer's integer counter), the full layer's
    keys and values. Floating leaves are held to the floor, integer leaves are listed without a magnitude."""
    from hf_exporters.pytree import register_model_pytrees
    from hf_exporters.runtime.compare import eager_outputs
    from hf_exporters.sweep import job
    from hf_exporters.sweep.inputs import build_inputs
    from hf_exporters.sweep.signal_check import judge

    model = job.build_model("Gemma2Model", use_cache=None)
    assert (model.config.layer_types, model.config.sliding_window) == (["sliding_attention", "full_attention"], 4)
    inputs = build_inputs(model)
    register_model_pytrees(model, inputs)
    first = eager_outputs(model, inputs)
    assert [(name, tuple(t.shape)) for name, t in first] == [
        ("last_hidden_state", (2, 8, 64)),
        ("past_key_values_0", (2, 2, 3, 16)), ("past_key_values_1", (2, 2, 3, 16)),
        ("past_key_values_2", (8, 0)), ("past_key_values_3", ()),
        ("past_key_values_4", (2, 2, 8, 16)), ("past_key_values_5", (2, 2, 8, 16)),
    ]
    verdict = judge(first, eager_outputs(model, job._signal_inputs(model, inputs)))
    assert verdict["ok"] and verdict["silent"] == [] and verdict["zero"] == [] and verdict["main"] == "last_hidden_state"
    integers = [leaf["name"] for leaf in verdict["leaves"] if leaf.get("integer")]
    assert integers == ["past_key_values_2", "past_key_values_3"]
    assert all(leaf["max_abs"] >= verdict["floor"] for leaf in verdict["leaves"] if not leaf.get("integer"))
