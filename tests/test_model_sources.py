"""Where ``--model`` may point: a local folder, a hub id in the Hugging Face cache, a checkpoint with its own code.

The cache is a folder laid out as ``huggingface_hub`` lays it out (``models--org--name/snapshots/<commit>/`` and
``refs/main``); nothing is downloaded (``HF_HUB_OFFLINE=1``, as the CLI sets it by default).
"""

import importlib.util
import json
import sys

import pytest
import torch
import transformers
from huggingface_hub import constants
from typer.testing import CliRunner

from hf_exporters.checkpoints import remote_code_files, resolve_model
from hf_exporters.cli import app
from hf_exporters.errors import InputError

runner = CliRunner()
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _run(*args):
    result = runner.invoke(app, list(args))
    return result.exit_code, result.output


def _tiny_bert() -> transformers.BertModel:
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4)
    return transformers.BertModel(config).eval()


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """A Hugging Face cache holding ``hfx-test/tiny-bert`` at :data:`COMMIT`, offline."""
    cache = tmp_path / "hub"
    repo = cache / "models--hfx-test--tiny-bert"
    _tiny_bert().save_pretrained(repo / "snapshots" / COMMIT)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


def test_hub_id_in_the_cache_exports(hub_cache, tmp_path):
    assert resolve_model("hfx-test/tiny-bert") == (hub_cache / "models--hfx-test--tiny-bert" / "snapshots" / COMMIT).resolve()
    out = tmp_path / "out"
    code, output = _run("export", "-m", "hfx-test/tiny-bert", "-b", "onnx", "-o", str(out))
    assert code == 0, output
    manifest = json.loads((out / "export.json").read_text())
    assert manifest["model_class"] == "BertModel"
    assert manifest["parity"][0]["max_abs_diff"] < 1e-4


def test_hub_id_not_in_the_cache_is_one_error_line(hub_cache, tmp_path):
    code, output = _run("export", "-m", "hfx-test/absent", "-o", str(tmp_path / "out"))
    assert code == 1
    assert output.strip() == (
        f"error: hfx-test/absent is not a local folder and is not in the Hugging Face cache ({hub_cache}); "
        "HF_HUB_OFFLINE=1, so nothing was downloaded (set HF_HUB_OFFLINE=0 to download it, or pass a local folder)"
    )
    assert not (tmp_path / "out").exists()


def test_a_path_that_is_no_hub_id_is_a_missing_folder(tmp_path):
    with pytest.raises(InputError) as caught:
        resolve_model(tmp_path / "a" / "b")
    assert str(caught.value) == (
        f"model folder not found: {tmp_path / 'a' / 'b'} (pass a local folder written by save_pretrained, or a hub id such as org/name)"
    )


CONFIGURATION = '''
from transformers import PretrainedConfig


class HfxTinyConfig(PretrainedConfig):
    model_type = "hfx_tiny"

    def __init__(self, hidden_size=8, **kwargs):
        self.hidden_size = hidden_size
        super().__init__(**kwargs)
'''

MODELING = '''
import torch
from transformers import PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput

from .configuration_hfx import HfxTinyConfig


class HfxTinyModel(PreTrainedModel):
    config_class = HfxTinyConfig

    def __init__(self, config):
        super().__init__(config)
        self.embed = torch.nn.Embedding(16, config.hidden_size)
        self.proj = torch.nn.Linear(config.hidden_size, config.hidden_size)
        self.post_init()

    def forward(self, input_ids, attention_mask=None):
        hidden = torch.tanh(self.proj(self.embed(input_ids)))
        return BaseModelOutput(last_hidden_state=hidden)
'''


@pytest.fixture
def custom_code_checkpoint(tmp_path, monkeypatch):
    """A checkpoint whose config and model classes live in its own files (``auto_map``), as on the hub."""
    folder = tmp_path / "custom"
    folder.mkdir()
    (folder / "configuration_hfx.py").write_text(CONFIGURATION)
    (folder / "modeling_hfx.py").write_text(MODELING)
    package = "hfx_custom_code_checkpoint"
    monkeypatch.setitem(sys.modules, package, importlib.util.module_from_spec(importlib.util.spec_from_loader(package, None, is_package=True)))
    sys.modules[package].__path__ = [str(folder)]
    modeling = importlib.import_module(f"{package}.modeling_hfx")
    config = sys.modules[f"{package}.configuration_hfx"].HfxTinyConfig(vocab_size=16)
    config.auto_map = {"AutoConfig": "configuration_hfx.HfxTinyConfig", "AutoModel": "modeling_hfx.HfxTinyModel"}
    config.architectures = ["HfxTinyModel"]
    torch.manual_seed(0)
    modeling.HfxTinyModel(config).save_pretrained(folder)
    written = json.loads((folder / "config.json").read_text())
    assert written["auto_map"]["AutoModel"] == "modeling_hfx.HfxTinyModel" and written["model_type"] == "hfx_tiny"
    return folder


def test_custom_code_is_refused_without_trust_remote_code(custom_code_checkpoint, tmp_path):
    assert remote_code_files(custom_code_checkpoint) == ["configuration_hfx.py", "modeling_hfx.py"]
    code, output = _run("export", "-m", str(custom_code_checkpoint), "-o", str(tmp_path / "out"))
    assert code == 1
    assert output.strip() == (
        f"error: {custom_code_checkpoint} needs its own Python code to load (configuration_hfx.py, modeling_hfx.py, "
        "named by auto_map in config.json); it is not run unless you pass --trust-remote-code (trust_remote_code=True): read that code first"
    )
    assert not (tmp_path / "out").exists()


def test_custom_code_exports_with_trust_remote_code(custom_code_checkpoint, tmp_path):
    out = tmp_path / "out"
    code, output = _run("export", "-m", str(custom_code_checkpoint), "--trust-remote-code", "-o", str(out))
    assert code == 0, output
    manifest = json.loads((out / "export.json").read_text())
    assert manifest["model_class"] == "HfxTinyModel" and manifest["task"] == "feature-extraction"
    assert manifest["source_model"] == str(custom_code_checkpoint.resolve()) and manifest["trust_remote_code"] is True
    assert manifest["parity"][0]["max_abs_diff"] < 1e-5
    assert manifest["outputs"][0]["name"] == "last_hidden_state"


def test_a_known_model_type_never_runs_the_checkpoints_code(tmp_path):
    folder = tmp_path / "bert"
    _tiny_bert().save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModel": "modeling_evil.Evil"}
    (folder / "config.json").write_text(json.dumps(config))
    assert remote_code_files(folder) == []
    code, output = _run("export", "-m", str(folder), "-o", str(tmp_path / "out"))
    assert code == 0, output
