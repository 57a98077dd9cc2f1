"""The CLI's export job and its error contract: one clear line, non-zero exit, nothing half-written."""

import json
import subprocess
import sys

import pytest
import torch
import transformers
from typer.testing import CliRunner

from hf_exporters.cli import app
from hf_exporters.pipeline import default_model_path

runner = CliRunner()


def _run(*args):
    result = runner.invoke(app, list(args))
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-bert")
    config = transformers.BertConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4)
    transformers.BertModel(config).save_pretrained(folder)
    return folder


def test_export_embedded_minilm_dynamic(tmp_path):
    out = tmp_path / "minilm"
    code, output = _run("export", "--backend", "dynamo", "--output", str(out), "--dynamic")
    assert code == 0, output
    assert "exported BertModel (feature-extraction) with dynamo" in output
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "export.json", "model.pt2", "tokenizer.json", "tokenizer_config.json"]
    manifest = json.loads((out / "export.json").read_text())
    assert manifest["backend"] == "dynamo" and manifest["schema_version"] == 1
    assert manifest["source_model"] == str(default_model_path().resolve()) and manifest["trust_remote_code"] is False
    assert [i["name"] for i in manifest["inputs"]] == ["input_ids", "token_type_ids", "attention_mask"]
    assert [o["name"] for o in manifest["outputs"]] == ["last_hidden_state", "pooler_output"]
    assert manifest["dynamic_axes"] == {"input_ids": [0, 1], "token_type_ids": [0, 1], "attention_mask": [0, 1]}
    assert manifest["static_axes"] == []
    assert len(manifest["parity"]) == 2  # the export inputs and a second set of other sizes
    first, second = manifest["parity"]
    assert second["input_shapes"]["input_ids"] != first["input_shapes"]["input_ids"]
    assert all(p["max_abs_diff"] <= 1e-4 and p["ok"] for p in manifest["parity"])
    # the saved program reloads and runs on its own, in a fresh process too
    proc = subprocess.run(
        [sys.executable, "-c", f"from hf_exporters import load_exported_program; print(type(load_exported_program({str(out)!r})).__name__)"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.stdout.strip() == "ExportedProgram", proc.stderr[-2000:]
    program = torch.export.load(str(out / "model.pt2"))
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    hidden = program.module()(**dict(tokenizer(["one", "two words"], padding=True, return_tensors="pt")))
    assert hidden.last_hidden_state.shape[:2] == (2, 4)


def test_onnx_manifest_names_the_graph_outputs(tiny_bert, tmp_path):
    out = tmp_path / "onnx"
    code, output = _run("export", "-m", str(tiny_bert), "-b", "onnx", "-o", str(out))
    assert code == 0, output
    outputs = json.loads((out / "export.json").read_text())["outputs"]
    assert [(o["name"], o["model_output"]) for o in outputs] == [
        ("last_hidden_state", "last_hidden_state"),
        ("pooler_output", "pooler_output"),
    ]


def test_task_whose_head_the_checkpoint_lacks(tiny_bert, tmp_path):
    code, output = _run("export", "-m", str(tiny_bert), "--task", "text-classification", "-o", str(tmp_path / "out"))
    assert code == 1
    assert output.strip().startswith(f"error: {tiny_bert} has no weights for 2 parameter(s) of BertForSequenceClassification")
    assert "task 'text-classification' needs a head this checkpoint does not have" in output
    assert not (tmp_path / "out").exists()


def test_export_from_config_without_tokenizer(tiny_bert, tmp_path):
    out = tmp_path / "bert"
    code, output = _run("export", "-m", str(tiny_bert), "-o", str(out))
    assert code == 0, output
    manifest = json.loads((out / "export.json").read_text())
    assert manifest["inputs"][0] == {"name": "input_ids", "shape": [2, 8], "dtype": "int64"}
    assert manifest["dynamic"] is False and len(manifest["parity"]) == 1


def test_missing_model_folder(tmp_path):
    code, output = _run("export", "-m", str(tmp_path / "nope"), "-o", str(tmp_path / "out"))
    assert code == 1
    assert output.strip() == (
        f"error: model folder not found: {tmp_path / 'nope'} "
        "(pass a local folder written by save_pretrained, or a hub id such as org/name)"
    )
    assert not (tmp_path / "out").exists()


def test_not_a_checkpoint(tmp_path):
    (tmp_path / "empty").mkdir()
    code, output = _run("export", "-m", str(tmp_path / "empty"), "-o", str(tmp_path / "out"))
    assert code == 1
    assert output.strip() == f"error: not a transformers checkpoint: {tmp_path / 'empty'} has no config.json"


def test_unknown_backend(tiny_bert, tmp_path):
    code, output = _run("export", "-m", str(tiny_bert), "-b", "tflite", "-o", str(tmp_path / "out"))
    assert code == 1
    assert output.strip() == "error: unknown backend 'tflite'; choose one of: dynamo, onnx, executorch"
    assert not (tmp_path / "out").exists()


def test_unknown_task(tiny_bert, tmp_path):
    code, output = _run("export", "-m", str(tiny_bert), "--task", "dance", "-o", str(tmp_path / "out"))
    assert code == 1
    assert output.startswith("error: unknown task 'dance'; choose one of: feature-extraction, text-generation")


def test_refuses_non_empty_output(tiny_bert, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    code, output = _run("export", "-m", str(tiny_bert), "-o", str(out))
    assert code == 1
    assert output.strip() == f"error: output folder {out} exists and is not empty (pass --overwrite to replace an earlier export)"
    assert (out / "keep.txt").read_text() == "x"
    # --overwrite replaces earlier exports only, never another folder
    code, output = _run("export", "-m", str(tiny_bert), "-o", str(out), "--overwrite")
    assert code == 1
    assert output.strip() == f"error: --overwrite replaces earlier exports only: {out} has no export.json, so it is left alone"
    assert (out / "keep.txt").read_text() == "x"


def test_overwrite_replaces_an_earlier_export_with_readable_permissions(tiny_bert, tmp_path):
    out = tmp_path / "out"
    assert _run("export", "-m", str(tiny_bert), "-o", str(out))[0] == 0
    first = json.loads((out / "export.json").read_text())["created"]
    code, output = _run("export", "-m", str(tiny_bert), "-o", str(out), "--overwrite", "--dynamic")
    assert code == 0, output
    manifest = json.loads((out / "export.json").read_text())
    assert manifest["dynamic"] is True and manifest["created"] >= first
    assert oct(out.stat().st_mode & 0o777) == oct(0o777 & ~_umask())


def _umask():
    import os

    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize("inside", [False, True])
def test_output_may_not_overlap_the_model_folder(tiny_bert, inside):
    out = tiny_bert / "exported" if inside else tiny_bert
    code, output = _run("export", "-m", str(tiny_bert), "-o", str(out), "--overwrite")
    assert code == 1
    assert output.strip() == f"error: output folder {out} overlaps the model folder {tiny_bert}; choose another --output"
    assert (tiny_bert / "model.safetensors").is_file() and not (tiny_bert / "exported").exists()


def test_output_that_is_a_file(tiny_bert, tmp_path):
    target = tmp_path / "afile"
    target.write_text("keep")
    code, output = _run("export", "-m", str(tiny_bert), "-o", str(target), "--overwrite")
    assert code == 1
    assert output.strip() == f"error: output path {target} is a file, not a folder"
    assert target.read_text() == "keep"


@pytest.mark.parametrize("value", ["-1", "nan"])
def test_invalid_tolerance(tiny_bert, tmp_path, value):
    code, output = _run("export", "-m", str(tiny_bert), "-o", str(tmp_path / "out"), "--atol", value)
    assert code == 1
    assert output.strip() == f"error: --atol must be a finite number >= 0, got {float(value)}"


def test_trace_failure_names_stage_and_source_line(tmp_path):
    """A checkpoint whose forward branches on data: the trace fails, the message blames the model line."""
    folder = tmp_path / "ckpt"
    code_dir = tmp_path / "code"
    code_dir.mkdir()
    (code_dir / "branchy_model.py").write_text(
        "import torch, transformers\n"
        "class BranchyConfig(transformers.PretrainedConfig):\n"
        "    model_type = 'branchy'\n"
        "    def __init__(self, vocab_size=16, **kw):\n"
        "        super().__init__(**kw); self.vocab_size = vocab_size\n"
        "class BranchyModel(transformers.PreTrainedModel):\n"
        "    config_class = BranchyConfig\n"
        "    def __init__(self, config):\n"
        "        super().__init__(config); self.emb = torch.nn.Embedding(16, 4); self.post_init()\n"
        "    def forward(self, input_ids, attention_mask=None):\n"
        "        h = self.emb(input_ids)\n"
        "        if h.sum() > 0:\n"
        "            return h * 2\n"
        "        return h\n"
    )
    script = (
        f"import sys; sys.path.insert(0, {str(code_dir)!r})\n"
        "import transformers, branchy_model as b\n"
        "transformers.AutoConfig.register('branchy', b.BranchyConfig)\n"
        "transformers.AutoModel.register(b.BranchyConfig, b.BranchyModel)\n"
        f"b.BranchyModel(b.BranchyConfig(architectures=['BranchyModel'])).save_pretrained({str(folder)!r})\n"
        "import transformers as t; setattr(t, 'BranchyModel', b.BranchyModel)\n"
        "from hf_exporters.cli import app\n"
        f"sys.argv = ['hf-exporters', 'export', '-m', {str(folder)!r}, '-o', {str(tmp_path / 'out')!r}]\n"
        "app()\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:") or "blamed source line" in ln]
    assert lines[0].startswith("error: [dynamo] trace (torch.export.export) failed: ")
    assert "data-dependent" in lines[0].lower() or "guard" in lines[0].lower()
    assert lines[1] == f"  blamed source line: {code_dir / 'branchy_model.py'}:12 (forward: if h.sum() > 0:)"
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")] == []


def test_missing_optional_dependency_names_the_extra(tiny_bert, tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name.split(".")[0] == "onnxscript":
            raise ModuleNotFoundError(f"No module named '{name}'", name=name)
        return real_import(name, *args, **kwargs)

    for mod in [m for m in sys.modules if m.startswith(("onnxscript", "hf_exporters.exporters.onnx"))]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setattr(builtins, "__import__", fake_import)
    code, output = _run("export", "-m", str(tiny_bert), "-b", "onnx", "-o", str(tmp_path / "out"))
    assert code == 1
    assert "needs the package 'onnxscript', which is not installed. Install it with: pip install 'hf-exporters[onnx]'" in output
    assert not (tmp_path / "out").exists()


def test_patches_lists_stage_and_upstream():
    code, output = _run("patches", "--backend", "dynamo", "--json")
    assert code == 0
    rows = json.loads(output)
    sdpa = next(r for r in rows if r["name"] == "_patch_sdpa_attention")
    assert sdpa["stage"] == "Stage 2: Model patches"
    assert sdpa["target"] == "transformers.modeling_utils.AttentionInterface._global_mapping"
    assert "huggingface/transformers#46196" in sdpa["upstream"]
    assert all(r["backend"] == "dynamo" for r in rows)


def test_patches_unknown_backend():
    code, output = _run("patches", "--backend", "tvm")
    assert code == 1
    assert output.strip() == "error: unknown backend 'tvm'; choose one of: dynamo, executorch, onnx"


def test_default_model_is_the_embedded_minilm():
    path = default_model_path()
    assert (path / "model.safetensors").is_file() and (path / "tokenizer.json").is_file()


# ── Faults a user hit: each prints one error: line, exits with its documented status, writes nothing ──


def test_generation_export_refuses_a_randomly_initialised_head(tmp_path):
    """A base-model checkpoint (LlamaModel, no lm_head) exported for text-generation: the head would be random."""
    folder = tmp_path / "base"
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2
    )
    transformers.LlamaModel(config).save_pretrained(folder)
    code, output = _run("export", "-m", str(folder), "--task", "text-generation", "-o", str(tmp_path / "out"))
    assert code == 1
    assert output.strip().splitlines()[-1] == (
        f"error: {folder} has no weights for 1 parameter(s) of LlamaForCausalLM (lm_head.weight): task 'text-generation' "
        "needs a head this checkpoint does not have, and exporting randomly initialised weights would be meaningless; "
        "choose the checkpoint's own task (or pass --allow-random-weights)"
    )
    assert not (tmp_path / "out").exists()


def test_nan_in_the_weights_blames_the_checkpoint(tiny_bert, tmp_path):
    broken = tmp_path / "broken"
    model = transformers.BertModel.from_pretrained(tiny_bert)
    with torch.no_grad():
        model.encoder.layer[0].output.dense.weight.fill_(float("nan"))
    model.save_pretrained(broken)
    code, output = _run("export", "-m", str(broken), "-o", str(tmp_path / "out"))
    assert code == 1
    assert output.strip().startswith(
        "error: eager PyTorch itself returns NaN or inf (last_hidden_state: 512 of 512 values; pooler_output: 64 of 64 values): "
        "the model or its checkpoint is broken"
    ), output
    assert not (tmp_path / "out").exists()


def test_corrupt_config_for_generation_is_one_error_line(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama", "hidden_size": ')
    code, output = _run("export", "-m", str(folder), "--task", "text-generation", "-o", str(tmp_path / "out"))
    assert code == 1
    assert output.strip().startswith(f"error: not a transformers checkpoint: config.json in {folder} cannot be read (")
    assert len(output.strip().splitlines()) == 1


def _cli_process(*args, **kwargs):
    from pathlib import Path

    command = Path(sys.executable).parent / "hf-exporters"  # the installed entry point, as a user runs it
    return subprocess.run([str(command), *args], capture_output=True, text=True, timeout=300, **kwargs)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["export", "-o", "/tmp/x", "--max-seq-len"], "error: Option '--max-seq-len' requires an argument. (see 'hf-exporters --help')"),
        (["generate", "nowhere", "-p", "x", "-n", "-5"], "error: Invalid value for '--max-new-tokens' / '-n': Input should be greater than or equal to 1 (see 'hf-exporters generate --help')"),
        (["dance"], "error: No such command 'dance'. (see 'hf-exporters --help')"),
        (
            ["export", "-o", "/tmp/x", "--on-static-axis", "maybe"],
            "error: Invalid value for '--on-static-axis': Value error, 'maybe' is not one of 'warn', 'error'. (see 'hf-exporters export --help')",
        ),
    ],
)
def test_usage_errors_are_one_line_with_status_2(args, message):
    proc = _cli_process(*args)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == message
    assert "Traceback" not in proc.stderr and "╭" not in proc.stderr


@pytest.mark.parametrize(("target", "reason"), [("/proc/hfx-test", "No such file or directory"), ("afile/sub", None)])
def test_unwritable_output_is_one_error_line(tiny_bert, tmp_path, target, reason):
    (tmp_path / "afile").write_text("keep")
    out = target if target.startswith("/") else str(tmp_path / target)
    code, output = _run("export", "-m", str(tiny_bert), "-o", out)
    assert code == 1
    line = output.strip()
    if reason:
        assert line == f"error: cannot write the output folder {out}: {reason}"
    else:
        assert line == f"error: cannot create the output folder {out}: {tmp_path / 'afile'} is a file, not a folder"
    assert (tmp_path / "afile").read_text() == "keep"


def test_sigterm_stops_the_export_and_leaves_nothing(tiny_bert, tmp_path):
    """SIGTERM while the artifact is being written: exit 143, no output folder, no staging folder."""
    marker = tmp_path / "saving"
    script = (
        "import sys, time, pathlib\n"
        "from hf_exporters.exporters.dynamo import DynamoExporter\n"
        "save = DynamoExporter.save\n"
        "def slow_save(self, program, folder):\n"
        "    path = save(self, program, folder)\n"
        f"    pathlib.Path({str(marker)!r}).write_text('x')\n"
        "    time.sleep(60)\n"
        "    return path\n"
        "DynamoExporter.save = slow_save\n"
        "from hf_exporters.cli import app\n"
        f"sys.argv = ['hf-exporters', 'export', '-m', {str(tiny_bert)!r}, '-o', {str(tmp_path / 'out')!r}]\n"
        "app()\n"
    )
    import signal
    import time

    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.tmp-")], "the export never reached its staging folder"
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, stderr
    assert stderr.strip().splitlines()[-1] == f"error: interrupted by SIGTERM; nothing was written to {tmp_path / 'out'}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["saving"]
