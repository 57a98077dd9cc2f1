"""The C++ runner (``cpp/``): ``hfx-run`` and the ``_hfx`` bindings against eager PyTorch and the
Python ExecuTorch runtime, its C++ unit tests (ctest), and malformed folders and files.

``make test`` builds the runner first (``make cpp``); the checks need the build and the executorch extra.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch
import transformers as tf

pytest.importorskip("executorch.runtime", reason="the C++ runner runs ExecuTorch programs: it needs the executorch extra")

from hf_exporters.errors import CppRunnerError, InputError  # noqa: E402
from hf_exporters.generation import ExportedGenerator, export_generation_folder  # noqa: E402
from hf_exporters.pipeline import build_inputs, default_model_path, export_to_folder, load_checkpoint  # noqa: E402
from hf_exporters.runtime import cpp_runner  # noqa: E402
from hf_exporters.runtime.compare import eager_outputs  # noqa: E402
from hf_exporters.runtime.et_runner import ExecutorchRunner  # noqa: E402
from config_models import spread_tiny_llama  # noqa: E402

BUILD = cpp_runner.build_dir()
if not (BUILD / "hfx-run").is_file():
    pytest.skip(reason=f"the C++ runner is not built in {BUILD} (make cpp)", allow_module_level=True)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ATOL = 1e-3


ASAN_BUILD = BUILD.parent / "cpp-asan"


def _hfx_run(*args: str, binary=None, env=None) -> subprocess.CompletedProcess:
    # errors="replace": with HFX_VERBOSE=1 the runtime's log quotes a corrupt file's bytes
    return subprocess.run([str(binary or BUILD / "hfx-run"), *map(str, args)], capture_output=True, text=True, errors="replace", timeout=300,
                          check=False, env={**os.environ, **(env or {})})


def _write_expectations(folder, model, inputs):
    """``inputs.safetensors`` (by manifest input name) and ``expected.safetensors`` (eager outputs by
    manifest output name) beside the exported folder."""
    from safetensors.torch import save_file

    manifest = json.loads((folder / "export.json").read_text())
    flat = {spec["name"]: tensor for spec, tensor in zip(manifest["inputs"], [v for v in inputs.values() if isinstance(v, torch.Tensor)])}
    names = [o["name"] if isinstance(o, dict) else o for o in manifest["outputs"]]
    expected = {name: tensor.contiguous() for name, (_, tensor) in zip(names, eager_outputs(model, inputs))}
    save_file({k: v.contiguous() for k, v in flat.items()}, folder.parent / f"{folder.name}-inputs.safetensors")
    save_file(expected, folder.parent / f"{folder.name}-expected.safetensors")
    return folder.parent / f"{folder.name}-inputs.safetensors", folder.parent / f"{folder.name}-expected.safetensors", expected


@pytest.fixture(scope="module")
def minilm_folder(tmp_path_factory):
    model, tokenizer, task = load_checkpoint(default_model_path())
    inputs = build_inputs(model, tokenizer)
    folder = tmp_path_factory.mktemp("cpp") / "minilm-pte"
    export_to_folder(model, inputs, "executorch", folder, dynamic=True, preprocessor=tokenizer, task=task)
    return folder, model, inputs


def test_minilm_forward_equals_eager_and_the_python_runtime(minilm_folder):
    folder, model, inputs = minilm_folder
    inputs_file, expected_file, expected = _write_expectations(folder, model, inputs)
    out = folder.parent / "minilm-cpp-out.safetensors"
    result = _hfx_run(folder, "--inputs", inputs_file, "--expect", expected_file, "--atol", ATOL, "--output", out)
    assert result.returncode == 0, result.stderr
    diffs = {m[0]: float(m[1]) for m in re.findall(r"^(\S+): max abs diff (\S+) ok$", result.stdout, re.M)}
    assert set(diffs) == set(expected) and max(diffs.values()) <= ATOL, result.stdout
    from safetensors.torch import load_file

    cpp = load_file(out)
    python = ExecutorchRunner(folder / "model.pte")(inputs)
    for name, tensor in zip(expected, python):
        assert torch.allclose(cpp[name], tensor, atol=1e-5, rtol=0), name


def test_tiny_llama_prefill_forward_equals_eager(tmp_path):
    model = spread_tiny_llama(tmp_path / "ckpt")
    ids = torch.randint(3, 96, (2, 7), generator=torch.Generator().manual_seed(0))
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    folder = tmp_path / "llama-prefill-pte"
    export_to_folder(model, inputs, "executorch", folder, dynamic=True)
    inputs_file, expected_file, expected = _write_expectations(folder, model, inputs)
    result = _hfx_run(folder, "--inputs", inputs_file, "--expect", expected_file, "--atol", ATOL)
    assert result.returncode == 0, result.stderr
    diffs = dict(re.findall(r"^(\S+): max abs diff (\S+) ok$", result.stdout, re.M))
    assert set(diffs) == set(expected) and "logits" in diffs  # logits and every layer's key/value cache


def test_int8_embedding_lookups_run_in_the_cpp_runtime(tmp_path):
    """A ``--qembedding 8w`` program holds ``quantized_decomposed::embedding_byte``, a kernel of ExecuTorch's
    quantized library, not of the runtime in _portable_lib: hfx-run links that library, and its outputs equal
    the Python runtime's."""
    from safetensors.torch import save_file

    torch.manual_seed(0)
    config = tf.BertConfig(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, max_position_embeddings=16)
    model = tf.BertModel(config).eval()
    ids = torch.randint(0, 512, (2, 6), generator=torch.Generator().manual_seed(0))
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    folder = tmp_path / "qembedding-pte"
    manifest = export_to_folder(model, inputs, "executorch", folder, quantize_embeddings="8w", validate=False, max_seq_len=12)
    assert manifest["executorch"]["embedding_lookups"] == 1 and manifest["max_seq_len"] == 12
    python = ExecutorchRunner(folder / "model.pte")(inputs)
    names = [o["name"] for o in manifest["outputs"]]
    save_file({spec["name"]: inputs[spec["name"]].contiguous() for spec in manifest["inputs"]}, tmp_path / "in.safetensors")
    save_file({name: torch.as_tensor(t).contiguous() for name, t in zip(names, python)}, tmp_path / "expected.safetensors")
    result = _hfx_run(folder, "--inputs", tmp_path / "in.safetensors", "--expect", tmp_path / "expected.safetensors", "--atol", "1e-6")
    assert result.returncode == 0, result.stderr
    assert sorted(re.findall(r"^(\S+): max abs diff \S+ ok$", result.stdout, re.M)) == sorted(names)
    # An index past the table aborts ExecuTorch's quantized embedding kernel (ET_CHECK): both runners refuse it first.
    for bad, shown in ((512, "512"), (-1, "-1")):
        wrong = ids.clone()
        wrong[1, 3] = bad
        with pytest.raises(InputError) as caught:
            ExecutorchRunner(folder / "model.pte")({"input_ids": wrong, "attention_mask": inputs["attention_mask"]})
        assert str(caught.value) == f"input 'input_ids' holds the index {shown}, outside the 512 rows of the embedding table it indexes (valid: 0 to 511)"
        save_file({"input_ids": wrong, "attention_mask": inputs["attention_mask"].contiguous()}, tmp_path / "wrong.safetensors")
        result = _hfx_run(folder, "--inputs", tmp_path / "wrong.safetensors")
        assert result.returncode == 1 and result.stderr.strip().splitlines()[-1] == (
            f"error: {folder / 'model.pte'}: input 0 holds the index {shown}, outside the 512 rows of the embedding table it indexes (valid: 0 to 511)"
        ), result.stderr


def test_a_wrong_expectation_exits_2(minilm_folder, tmp_path):
    from safetensors.torch import save_file

    folder, model, inputs = minilm_folder
    inputs_file, _, expected = _write_expectations(folder, model, inputs)
    wrong = tmp_path / "wrong.safetensors"
    save_file({k: v + 1.0 for k, v in expected.items()}, wrong)
    result = _hfx_run(folder, "--inputs", inputs_file, "--expect", wrong, "--atol", ATOL)
    assert result.returncode == 2 and "outputs differ beyond tolerance (atol 0.001)" in result.stdout


def test_an_expect_file_without_an_output_fails_naming_it(minilm_folder, tmp_path):
    """An output missing from --expect is a parity failure (exit 2) naming it; none compared is one too."""
    from safetensors.torch import save_file

    folder, model, inputs = minilm_folder
    inputs_file, _, expected = _write_expectations(folder, model, inputs)
    names = sorted(expected)
    assert len(names) >= 2, names
    partial = tmp_path / "partial.safetensors"
    save_file({names[0]: expected[names[0]]}, partial)
    result = _hfx_run(folder, "--inputs", inputs_file, "--expect", partial, "--atol", ATOL)
    missing = ", ".join(names[1:])
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert result.stderr.splitlines() == [f"error: output{'s' if len(names) > 2 else ''} {missing} {'are' if len(names) > 2 else 'is'} not in {partial} "
                                          f"({len(names) - 1} of {len(names)} outputs not compared)"], result.stderr
    assert "all outputs within tolerance" not in result.stdout and f"{names[0]}: max abs diff" in result.stdout
    unrelated = tmp_path / "unrelated.safetensors"
    save_file({"something_else": torch.zeros(2)}, unrelated)
    result = _hfx_run(folder, "--inputs", inputs_file, "--expect", unrelated, "--atol", ATOL)
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert result.stderr.splitlines() == [f"error: nothing compared: none of the {len(names)} outputs ({', '.join(names)}) is in {unrelated}"]
    assert "within tolerance" not in result.stdout


@pytest.mark.parametrize("atol", ["nan", "-1e-3", "inf", "-nan"])
def test_a_nan_or_negative_atol_is_a_usage_error(atol):
    result = _hfx_run("/nonexistent-folder", "--inputs", "in.safetensors", "--atol", atol)
    assert result.returncode == 1 and result.stderr == f"error: --atol: '{atol}' is not a tolerance (give a finite number >= 0)\n"


def test_usage_states_the_exit_statuses():
    result = _hfx_run("--help")
    assert result.returncode == 0 and "2 a parity failure: an output beyond --atol, an output missing from the --expect file, or nothing compared" in result.stdout


@pytest.fixture(scope="module")
def llama_generation(tmp_path_factory):
    from hf_exporters.demo import write_word_tokenizer

    root = tmp_path_factory.mktemp("cpp-gen")
    model = spread_tiny_llama(root / "ckpt")
    write_word_tokenizer(root / "ckpt", 96)
    folder = root / "gen-pte"
    export_generation_folder(root / "ckpt", "executorch", folder)
    return model, folder


def test_the_parts_are_the_methods_of_one_program(llama_generation):
    """The folder's prefill and decode are the methods of one model.pte (one lowering, the weights stored once),
    each with its own constant method counting the mutated-input outputs."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    _, folder = llama_generation
    manifest = json.loads((folder / "export.json").read_text())
    assert {name: (part["file"], part["method"], part["files"]) for name, part in manifest["parts"].items()} == {
        "prefill": ("model.pte", "prefill", ["model.pte"]),
        "decode": ("model.pte", "decode", ["model.pte"]),
    }
    assert sorted(p.name for p in folder.rglob("*.pte")) == ["model.pte"]
    # each part reports its own method's partitions; the shared lowering is the program's, recorded once
    assert {name: list(part["partitions"]) for name, part in manifest["parts"].items()} == {"prefill": ["prefill"], "decode": ["decode"]}
    program = manifest["program"]
    assert (program["file"], program["methods"], sorted(program["stage_seconds"])) == (
        "model.pte", ["prefill", "decode"], ["lowering (to_edge_transform_and_lower)", "serialisation (to_executorch)"])
    assert all(part["export_seconds"] < sum(program["stage_seconds"].values()) + part["stage_seconds"]["trace (torch.export.export)"] for part in manifest["parts"].values())
    plans = sorted(plan.name for plan in deserialize_pte_binary((folder / "model.pte").read_bytes()).program.execution_plan)
    assert plans == [
        "decode",
        "hf_exporters_input_equal_axes.decode",
        "hf_exporters_input_equal_axes.prefill",
        "hf_exporters_input_index_bounds.decode",
        "hf_exporters_input_index_bounds.prefill",
        "hf_exporters_input_mutation_outputs.decode",
        "hf_exporters_input_mutation_outputs.prefill",
        "hf_exporters_input_static_axes.decode",  # the cache's heads and head size (the prompt has no static axis)
        "prefill",
    ]
    # input_ids (the first input of each method) indexes the 96-row token table
    runner = ExecutorchRunner(folder / "model.pte", "decode")
    assert (runner.index_bounds, runner.for_method("prefill").index_bounds) == ({0: (96, 0)}, {0: (96, 0)})


def test_cpp_greedy_ids_equal_eager_generate(llama_generation):
    model, folder = llama_generation
    prompt = [5, 17, 33, 2, 71, 9]
    with torch.no_grad():
        eager = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                               max_new_tokens=8, do_sample=False)
    result = _hfx_run(folder, "--generate", "--input-ids", ",".join(map(str, prompt)), "--max-new-tokens", 8)
    assert result.returncode == 0, result.stderr
    ids = [int(i) for i in re.search(r"^ids: (\S+)$", result.stdout, re.M).group(1).split(",")]
    assert ids == eager[0].tolist()
    assert len(set(ids[len(prompt):])) > 1  # not one repeated token
    assert re.search(r"^8 new tokens in [0-9.]+ s: [0-9.]+ tokens/s \(executorch\)$", result.stdout, re.M)
    module = cpp_runner.load_module()
    bound_ids, new_tokens, _ = module.generate_greedy(str(folder), prompt, 8)
    assert bound_ids == eager[0].tolist() and new_tokens == 8


@pytest.fixture(scope="module", params=[True, False], ids=["custom-sdpa", "torch-attention"])
def llama_program_cache(tmp_path_factory, request):
    """With ExecuTorch's LLM operators (llama::update_cache, llama::custom_sdpa: hfx-run links their kernels)
    and without."""
    root = tmp_path_factory.mktemp("cpp-program-cache")
    model = spread_tiny_llama(root / "ckpt")
    folder = root / "gen-pte"
    export_generation_folder(root / "ckpt", "executorch", folder, kv_cache="program", max_seq_len=24, custom_sdpa=request.param)
    return model, folder


def test_cpp_drives_the_cache_held_in_the_program_by_position(llama_program_cache):
    """``--kv-cache program``: hfx-run feeds the prompt at positions 0..T-1, then each new token at the next
    position, with no cache tensor in or out; its ids equal eager's, a second prompt starts afresh, and a
    request past the cache's positions is refused before anything runs."""
    model, folder = llama_program_cache
    module = cpp_runner.load_module()
    for prompt in ([5, 17, 33, 2, 71, 9], [40, 3, 3]):
        with torch.no_grad():
            eager = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long), max_new_tokens=8, do_sample=False)
        result = _hfx_run(folder, "--generate", "--input-ids", ",".join(map(str, prompt)), "--max-new-tokens", 8)
        assert result.returncode == 0, result.stderr
        ids = [int(i) for i in re.search(r"^ids: (\S+)$", result.stdout, re.M).group(1).split(",")]
        assert ids == eager[0].tolist() and len(set(ids[len(prompt):])) > 1
        bound_ids, new_tokens, _ = module.generate_greedy(str(folder), prompt, 8)
        assert bound_ids == eager[0].tolist() and new_tokens == 8
    from safetensors.torch import save_file

    inputs = folder.parent / "mismatched.safetensors"  # two tokens at one position: traced as one length
    save_file({"input_ids": torch.tensor([[1, 2]]), "cache_position": torch.tensor([0])}, inputs)
    result = _hfx_run(folder, "--inputs", inputs)
    assert result.returncode == 1 and result.stderr.strip().splitlines()[-1] == (
        f"error: {folder / 'model.pte'}: inputs 0 (axis 1) and 1 (axis 0) are 2 and 1 long: the program was exported with one size for both"
    ), result.stderr
    save_file({"input_ids": torch.zeros(0, 2, dtype=torch.long), "cache_position": torch.tensor([0, 1])}, inputs)  # no row: traced at 1
    result = _hfx_run(folder, "--inputs", inputs)
    assert result.returncode == 1 and result.stderr.strip().splitlines()[-1] == (
        f"error: {folder / 'model.pte'}: input 0 is 0 long on axis 0, which the program was exported for at 1 only"
    ), result.stderr
    if json.loads((folder / "export.json").read_text())["parts"]["decode"]["cache"]["custom_ops"]:
        save_file({"input_ids": torch.tensor([[1, 2, 3]]), "cache_position": torch.tensor([23, 0, 1])}, inputs)  # a run past the cache
        result = _hfx_run(folder, "--inputs", inputs)
        assert result.returncode == 1 and result.stderr.strip().splitlines()[-1] == (
            f"error: {folder / 'model.pte'}: input 1 starts at position 23: its 3 positions from there pass the 24 positions of the cache "
            "it writes (valid starts for 3: 0 to 21)"
        ), result.stderr
        save_file({"input_ids": torch.tensor([[1, 2, 3]]), "cache_position": torch.tensor([0, 1, 7])}, inputs)  # not one run
        result = _hfx_run(folder, "--inputs", inputs)
        assert result.returncode == 1 and result.stderr.strip().splitlines()[-1] == (
            f"error: {folder / 'model.pte'}: input 1 holds the positions 1 then 7 (elements 1 and 2): the cache is written at one run of "
            "positions, each one past the one before"
        ), result.stderr
    result = _hfx_run(folder, "--generate", "--input-ids", ",".join(["1"] * 20), "--max-new-tokens", 8)
    assert result.returncode == 1 and result.stderr.strip().splitlines()[-1] == (
        "error: prompt of 20 tokens and 8 new tokens need 27 positions, this folder was exported for at most 24 "
        "(re-export with hf-exporters export --max-seq-len 27 or more, or ask for at most 5 new tokens)"
    ), result.stderr


def test_generator_with_the_cpp_runtime_equals_the_python_runtime(llama_generation):
    model, folder = llama_generation
    inputs = {"input_ids": torch.tensor([[5, 17, 33, 2, 71, 9], [0, 0, 4, 8, 15, 16]]), "attention_mask": torch.tensor([[1] * 6, [0, 0, 1, 1, 1, 1]])}
    with torch.no_grad():
        eager = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    cpp = ExportedGenerator.from_pretrained(folder, runtime="cpp").generate(**inputs, max_new_tokens=8)
    assert cpp.tolist() == eager.tolist()


def test_generator_with_the_python_runtime_equals_eager_and_refuses_long_prompts(llama_generation):
    """The same folder through ``executorch.runtime`` (the Python generator; the fast tier's ExecuTorch generation
    round trip, sharing this module's export): a padded batch gives eager's ids, and a prompt past the bound the
    programs were planned for is refused before the runtime runs."""
    from hf_exporters.errors import InputError
    from hf_exporters.workarounds.executorch.fx_program_fixes import UNBOUNDED_DIM_MAX

    model, folder = llama_generation
    inputs = {"input_ids": torch.tensor([[5, 17, 33, 2, 71, 9], [0, 0, 4, 8, 15, 16]]), "attention_mask": torch.tensor([[1] * 6, [0, 0, 1, 1, 1, 1]])}
    with torch.no_grad():
        eager = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    generator = ExportedGenerator.from_pretrained(folder)
    assert generator.runners["decode"].program is generator.runners["prefill"].program  # the program is loaded once
    assert generator.generate(**inputs, max_new_tokens=8).tolist() == eager.tolist()
    limit = UNBOUNDED_DIM_MAX
    long_prompt = torch.randint(3, 64, (1, limit + 72))
    with pytest.raises(InputError, match=rf"^prompt of {limit + 72} tokens: this folder was exported for at most {limit} \(re-export with a larger --max-seq-len\)$"):
        generator.generate(input_ids=long_prompt, max_new_tokens=2)
    with pytest.raises(InputError, match=rf"^prompt of 100 tokens plus 40 new tokens needs 139 positions: this folder was exported for at most {limit} "):
        generator.generate(input_ids=long_prompt[:, :100], max_new_tokens=40)


def test_cli_generate_with_the_cpp_runtime(llama_generation):
    _, folder = llama_generation
    done = subprocess.run([sys.executable, "-m", "hf_exporters.cli", "generate", str(folder), "--prompt", "a b c d e f",
                           "--max-new-tokens", "8", "--compare-eager", "--runtime", "cpp"], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "equal to eager generate(): yes" in done.stdout and "tokens/s (executorch)" in done.stdout


def test_ctest_unit_tests_pass_with_a_real_program(minilm_folder):
    folder, _, _ = minilm_folder
    result = subprocess.run(["ctest", "--test-dir", str(BUILD), "--output-on-failure"], capture_output=True, text=True,
                            env={**os.environ, "HFX_FIXTURES": str(folder)}, timeout=600, check=False)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "100% tests passed" in result.stdout and "Skipped" not in result.stdout


def test_a_prompt_longer_than_the_export_bound_is_refused_before_running(llama_generation):
    """The prefill and decode programs were planned for sequences up to a bound (``--max-seq-len``,
    default 128): a longer prompt is refused before running, with both numbers and the flag, not
    'execute failed (ExecuTorch error 18)'."""
    from hf_exporters.workarounds.executorch.fx_program_fixes import UNBOUNDED_DIM_MAX

    _, folder = llama_generation
    limit = UNBOUNDED_DIM_MAX  # exported without --max-seq-len, from a 7-token example
    result = _hfx_run(folder, "--generate", "--input-ids", ",".join(["5"] * (limit + 1)), "--max-new-tokens", 1)
    assert (result.returncode, result.stderr) == (
        1, f"error: prompt of {limit + 1} tokens, this folder was exported for at most {limit} "
           f"(re-export with hf-exporters export --max-seq-len {limit + 1} or more)\n")
    # the prompt fits, prompt and new tokens do not: refused before the prefill runs
    fits = ",".join(["5"] * (limit - 10))
    result = _hfx_run(folder, "--generate", "--input-ids", fits, "--max-new-tokens", 12)
    assert (result.returncode, result.stderr) == (
        1, f"error: prompt of {limit - 10} tokens and 12 new tokens need {limit + 1} positions, this folder was exported for at most {limit} "
           f"(re-export with hf-exporters export --max-seq-len {limit + 1} or more, or ask for at most 11 new tokens)\n")
    assert _hfx_run(folder, "--generate", "--input-ids", fits, "--max-new-tokens", 11).returncode == 0
    module = cpp_runner.load_module()
    with pytest.raises(module.HfxError, match=f"prompt of {limit + 1} tokens, this folder was exported for at most {limit}"):
        module.generate_greedy(str(folder), [5] * (limit + 1), 1)
    part = cpp_runner.CppExecutorchRunner(folder / "model.pte", "prefill")
    assert [list(b) for b in part.part.input_bounds()] == [[limit, limit], [limit, limit]]
    ids = torch.full((1, limit + 1), 5)
    with pytest.raises(CppRunnerError, match=f"input 0 axis 1 is {limit + 1}, the program was exported for at most {limit} .*--max-seq-len"):
        part({"input_ids": ids, "attention_mask": torch.ones_like(ids)})


MALFORMED = [
    ("truncate", "not a valid ExecuTorch program"),
    ("random_bytes", "not a valid ExecuTorch program"),
    ("empty", "not a valid ExecuTorch program"),
    ("huge_plan", "bytes of planned memory, more than this machine's"),
    ("schema", "unknown schema_version 7"),
    ("escape", "is outside the folder"),
    ("missing", "is missing"),
    ("garbage_json", "not valid JSON"),
    ("method", "model.pte: the program has no method 'nope'"),
    ("same_method", "part 'prefill': shares model.pte and method 'prefill' with part 'decode'"),
    ("no_method", "part 'prefill': shares model.pte with part 'decode', and not both name a 'method' of it"),
    ("own_method", "part 'decode': 'method' is not a method name: 'hf_exporters_input_static_axes.decode'"),
]


def _with_planned_buffer_size(data: bytes, size: int, method: str) -> bytes:
    """``data`` (a .pte) with ``method``'s last memory-planned buffer size set to ``size``, in place."""
    import struct

    from executorch.exir._serialize._program import deserialize_pte_binary

    plan = next(p for p in deserialize_pte_binary(data).program.execution_plan if p.name == method)
    sizes = plan.non_const_buffer_sizes
    old = struct.pack(f"<{len(sizes)}q", *sizes)
    assert data.count(old) == 1, sizes
    return data.replace(old, struct.pack(f"<{len(sizes)}q", *sizes[:-1], size))


def _broken_copy(folder, tmp_path, edit):
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    manifest = json.loads((broken / "export.json").read_text())
    decode = broken / manifest["parts"]["decode"]["file"]
    if edit == "truncate":
        decode.write_bytes(decode.read_bytes()[: decode.stat().st_size // 3])
    elif edit == "random_bytes":
        decode.write_bytes(torch.randint(0, 256, (decode.stat().st_size,), generator=torch.Generator().manual_seed(0), dtype=torch.uint8).numpy().tobytes())
    elif edit == "empty":
        decode.write_bytes(b"")
    elif edit == "huge_plan":  # a corrupt planned-buffer size (was bad_alloc; under ASan an abort)
        decode.write_bytes(_with_planned_buffer_size(decode.read_bytes(), 1 << 50, manifest["parts"]["decode"]["method"]))
    elif edit == "schema":
        manifest["schema_version"] = 7
    elif edit == "escape":
        manifest["parts"]["decode"]["file"] = "../../../etc/passwd"
    elif edit == "missing":
        decode.unlink()
    elif edit == "method":
        manifest["parts"]["decode"]["method"] = "nope"
    elif edit == "same_method":
        manifest["parts"]["decode"]["method"] = "prefill"
    elif edit == "no_method":
        del manifest["parts"]["decode"]["method"]
    elif edit == "own_method":  # one of the exporter's constant methods, which the program does hold
        manifest["parts"]["decode"]["method"] = "hf_exporters_input_static_axes.decode"
    if edit in ("schema", "escape", "method", "same_method", "no_method", "own_method"):
        (broken / "export.json").write_text(json.dumps(manifest))
    if edit == "garbage_json":
        (broken / "export.json").write_text("{ not json")
    return broken


@pytest.mark.parametrize(("edit", "message"), MALFORMED)
def test_malformed_folders_are_errors_not_crashes(llama_generation, tmp_path, edit, message):
    broken = _broken_copy(llama_generation[1], tmp_path, edit)
    result = _hfx_run(broken, "--generate", "--input-ids", "1,2,3", "--max-new-tokens", 2)
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert result.stderr.startswith("error: ") and message in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ("same_method", r"export\.json: parts 'prefill', 'decode' share 'model\.pte' and a method \(prefill\)$"),
        ("no_method", r"export\.json: parts 'prefill', 'decode' share 'model\.pte', and part 'decode' names no 'method' of it$"),
        ("method", r"model\.pte: part 'decode': the program has no method 'nope' \(it has \["),
    ],
)
def test_the_python_generator_refuses_a_part_without_its_own_method(llama_generation, tmp_path, edit, message):
    from hf_exporters.errors import ManifestError

    broken = _broken_copy(llama_generation[1], tmp_path, edit)
    with pytest.raises(ManifestError, match=message):
        ExportedGenerator.from_pretrained(broken)


def test_malformed_folders_under_address_and_undefined_behaviour_sanitizers(llama_generation, tmp_path):
    """The malformed cases again with the sanitizer build (``make cpp-asan``): an error, no sanitizer report."""
    if not (ASAN_BUILD / "hfx-run").is_file():
        pytest.skip(reason=f"the sanitizer build is missing ({ASAN_BUILD}; make cpp-asan)")
    env = {"HFX_VERBOSE": "1", "ASAN_OPTIONS": "detect_leaks=0:halt_on_error=1", "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1"}
    for edit, message in MALFORMED:
        broken = _broken_copy(llama_generation[1], tmp_path / edit, edit)
        result = _hfx_run(broken, "--generate", "--input-ids", "1,2,3", "--max-new-tokens", 2, binary=ASAN_BUILD / "hfx-run", env=env)
        assert result.returncode == 1, (edit, result.returncode, result.stderr[-2000:])
        assert "Sanitizer" not in result.stderr and "runtime error:" not in result.stderr, result.stderr[-2000:]
        assert result.stderr.strip().splitlines()[-1].startswith("error: ") and message in result.stderr
    good = _hfx_run(llama_generation[1], "--generate", "--input-ids", "1,2,3", "--max-new-tokens", 4, binary=ASAN_BUILD / "hfx-run", env=env)
    assert good.returncode == 0 and "Sanitizer" not in good.stderr, good.stderr[-2000:]
    unit = subprocess.run([str(ASAN_BUILD / "hfx_tests")], capture_output=True, text=True, timeout=600, check=False,
                          env={**os.environ, **env})
    assert unit.returncode == 0 and "Sanitizer" not in unit.stderr, (unit.stdout[-2000:], unit.stderr[-2000:])


def test_a_random_or_truncated_model_file_is_an_error(minilm_folder, tmp_path):
    """A single export's model.pte replaced by random bytes or cut short: one error line, status 1."""
    folder, model, inputs = minilm_folder
    inputs_file, _, _ = _write_expectations(folder, model, inputs)
    data = (folder / "model.pte").read_bytes()
    noise = torch.randint(0, 256, (1 << 16,), generator=torch.Generator().manual_seed(1), dtype=torch.uint8).numpy().tobytes()
    for name, blob in [("random", noise), ("header", data[:64]), ("half", data[: len(data) // 2]), ("one-short", data[:-1])]:
        broken = tmp_path / name
        shutil.copytree(folder, broken, ignore=shutil.ignore_patterns("model.pte"))
        (broken / "model.pte").write_bytes(blob)
        result = _hfx_run(broken, "--inputs", inputs_file)
        assert result.returncode == 1, (name, result.returncode, result.stderr)
        assert result.stderr.startswith("error: ") and len(result.stderr.splitlines()) == 1, (name, result.stderr)
        assert "not a valid ExecuTorch program" in result.stderr or "cannot load method" in result.stderr, (name, result.stderr)


def test_cli_usage_errors():
    assert _hfx_run().returncode == 1
    bad = _hfx_run("/nonexistent-folder", "--generate", "--input-ids", "1")
    assert bad.returncode == 1 and bad.stderr == "error: /nonexistent-folder: not a folder\n"
    with pytest.raises(CppRunnerError, match="not a valid ExecuTorch program"):
        cpp_runner.CppExecutorchRunner(__file__)


# ── AOTInductor packages (dynamo --aoti) ─────────────────────────────────────


def test_aoti_minilm_forward_equals_eager(tmp_path):
    model, tokenizer, task = load_checkpoint(default_model_path())
    inputs = build_inputs(model, tokenizer)
    folder = tmp_path / "minilm-aoti"
    manifest = export_to_folder(model, inputs, "dynamo", folder, dynamic=True, preprocessor=tokenizer, task=task, aoti=True)
    assert manifest["aoti_package"] == "model.aoti.pt2" and all(p["ok"] for p in manifest["aoti_parity"])
    inputs_file, expected_file, expected = _write_expectations(folder, model, inputs)
    result = _hfx_run(folder, "--inputs", inputs_file, "--expect", expected_file, "--atol", 1e-4)
    assert result.returncode == 0, result.stderr
    assert len(re.findall(r"^\S+: max abs diff \S+ ok$", result.stdout, re.M)) == len(expected)


@pytest.mark.slow  # two AOTInductor compilations (~45 s); the fast tier compiles MiniLM's forward above
def test_aoti_greedy_ids_equal_eager_generate(llama_generation, tmp_path):
    model, _ = llama_generation
    checkpoint = tmp_path / "ckpt"
    model.save_pretrained(checkpoint)
    folder = tmp_path / "gen-aoti"
    manifest = export_generation_folder(checkpoint, "dynamo", folder, aoti=True)
    assert manifest["parts"]["decode"]["aoti_package"] == "decode/model.aoti.pt2"
    prompt = [5, 17, 33, 2, 71, 9]
    with torch.no_grad():
        eager = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long), max_new_tokens=8, do_sample=False)
    result = _hfx_run(folder, "--generate", "--input-ids", ",".join(map(str, prompt)), "--max-new-tokens", 8)
    assert result.returncode == 0, result.stderr
    assert [int(i) for i in re.search(r"^ids: (\S+)$", result.stdout, re.M).group(1).split(",")] == eager[0].tolist()
    (folder / "decode" / "model.aoti.pt2").write_bytes(b"PK\x03\x04 not a package")
    broken = _hfx_run(folder, "--generate", "--input-ids", "1,2,3", "--max-new-tokens", 2)
    assert broken.returncode == 1 and "not a loadable AOTInductor package" in broken.stderr, broken.stderr


def test_a_folder_without_a_runnable_file_is_an_error(tmp_path):
    model, tokenizer, task = load_checkpoint(default_model_path())
    folder = tmp_path / "minilm-pt2"
    inputs = build_inputs(model, tokenizer)
    export_to_folder(model, inputs, "dynamo", folder, validate=False)
    inputs_file, _, _ = _write_expectations(folder, model, inputs)
    result = _hfx_run(folder, "--inputs", inputs_file)
    assert result.returncode == 1
    assert "part 'model' is exported_program; hfx runs ExecuTorch programs (.pte) and AOTInductor packages (export with --aoti)" in result.stderr


def test_a_sweep_job_runs_on_the_cpp_runtime():
    from hf_exporters.sweep import runner
    from hf_exporters.sweep.job import run_job

    spec = {"class": "BertModel", "backend": "executorch", "dynamic": True, "runtime": "cpp"}
    record = run_job(spec)
    assert record["outcome"] == "pass", record
    assert record["input_sets"] == 2 and record["max_abs_diff"] <= record["atol"]
    assert runner.job_key(spec) == "ours|executorch|dynamic|BertModel|cpp"


def test_generation_stops_at_the_folders_end_of_sequence_token(llama_generation, tmp_path):
    """With no --eos-token-id, hfx-run stops at the folder's generation_config.json eos_token_id (an id or a
    list), as ExportedGenerator and transformers' generate do; an explicit --eos-token-id stops at its own."""
    model, folder = llama_generation
    prompt = [5, 17, 33, 2, 71, 9]
    full = _hfx_run(folder, "--generate", "--input-ids", ",".join(map(str, prompt)), "--max-new-tokens", 8)
    assert full.returncode == 0 and full.stderr == ""  # no runtime log line (the prefill has no static-axes method)
    ids = [int(i) for i in re.search(r"^ids: (\S+)$", full.stdout, re.M).group(1).split(",")]
    new = ids[len(prompt):]
    assert len(new) == 8 and len(set(new)) > 2, new
    stop = new[2]
    copy = tmp_path / "eos"
    shutil.copytree(folder, copy)
    for eos in (stop, [stop, 10_000]):
        (copy / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
        result = _hfx_run(copy, "--generate", "--input-ids", ",".join(map(str, prompt)), "--max-new-tokens", 8)
        assert result.returncode == 0, result.stderr
        assert re.search(r"^ids: (\S+)$", result.stdout, re.M).group(1) == ",".join(map(str, ids[: len(prompt) + new.index(stop) + 1]))
        python = ExportedGenerator.from_pretrained(copy).generate(torch.tensor([prompt]), max_new_tokens=8)
        assert python[0].tolist() == ids[: len(prompt) + new.index(stop) + 1]
    result = _hfx_run(copy, "--generate", "--input-ids", ",".join(map(str, prompt)), "--max-new-tokens", 8, "--eos-token-id", new[0])
    assert re.search(r"^ids: (\S+)$", result.stdout, re.M).group(1) == ",".join(map(str, ids[: len(prompt) + 1]))
    (copy / "generation_config.json").write_text(json.dumps({"eos_token_id": "end"}))
    result = _hfx_run(copy, "--generate", "--input-ids", "1,2", "--max-new-tokens", 2)
    assert result.returncode == 1 and result.stderr.strip() == (
        f"error: {copy.resolve() / 'generation_config.json'}: eos_token_id is not a token id or a list of them"
    ), result.stderr


def test_cpp_generates_from_a_float16_program_and_times_prefill_and_decode(tmp_path):
    """``--dtype float16`` generation folder with the cache in the program: hfx-run reads float16 logits, its ids
    equal float16 eager's, and it prints the prompt's forward and the decode steps' rate on their own."""
    model = spread_tiny_llama(tmp_path / "ckpt")
    folder = tmp_path / "gen-fp16"
    manifest = export_generation_folder(tmp_path / "ckpt", "executorch", folder, kv_cache="program", max_seq_len=24, dtype="float16")
    assert manifest["dtype"] == "float16" and manifest["parts"]["decode"]["parity"]["ok"]
    prompt = [5, 17, 33, 2, 71, 9]
    with torch.no_grad():
        eager = model.half().generate(torch.tensor([prompt]), attention_mask=torch.ones(1, 6, dtype=torch.long), max_new_tokens=8, do_sample=False)
    result = _hfx_run(folder, "--generate", "--input-ids", ",".join(map(str, prompt)), "--max-new-tokens", 8)
    assert result.returncode == 0, result.stderr
    ids = [int(i) for i in re.search(r"^ids: (\S+)$", result.stdout, re.M).group(1).split(",")]
    assert ids == eager[0].tolist() and len(set(ids[len(prompt):])) > 1
    assert re.search(r"^prefill: [0-9.]+ ms for 6 tokens; decode: 7 steps, [0-9.]+ tokens/s$", result.stdout, re.M), result.stdout


def test_repeat_prints_the_mean_median_and_spread(minilm_folder):
    folder, model, inputs = minilm_folder
    inputs_file, _, _ = _write_expectations(folder, model, inputs)
    result = _hfx_run(folder, "--inputs", inputs_file, "--repeat", 3)
    assert result.returncode == 0, result.stderr
    found = re.search(r"^latency: ([0-9.]+) ms \(mean of 3 runs after a warm-up run\); median ([0-9.]+) ms, min ([0-9.]+) ms, max ([0-9.]+) ms$",
                      result.stdout, re.M)
    assert found, result.stdout
    mean, median, low, high = map(float, found.groups())
    assert 0 < low <= median <= high and low <= mean <= high


def test_cpp_drives_a_quantized_program_cache_with_a_group_size(tmp_path):
    """8da4w in groups of 64 with int8 embeddings, the cache in the program: only the linears whose input
    features are a multiple of 64 (each layer's down_proj, 64 in) take int4 weights, the rest stay float; hfx-run
    and the Python generator give the same ids from the program."""
    spread_tiny_llama(tmp_path / "ckpt")
    folder = tmp_path / "q"
    manifest = export_generation_folder(tmp_path / "ckpt", "executorch", folder, kv_cache="program", max_seq_len=24, quantize="8da4w",
                                        group_size=64, quantize_embeddings="8w", validate=False)
    quantization = manifest["executorch"]
    assert (quantization["quantize"], quantization["group_size"], quantization["quantized_linears"], quantization["float_linears"]) == ("8da4w", 64, 2, 13)
    assert (quantization["quantize_embeddings"], quantization["quantized_embeddings"]) == ("8w", 1)
    assert manifest["parts"]["decode"]["cache"]["kind"] == "program" and manifest["parts"]["decode"]["parity"] is None
    prompt = [5, 17, 33, 2, 71, 9]
    python_ids = ExportedGenerator.from_pretrained(folder).generate(torch.tensor([prompt]), max_new_tokens=8)[0].tolist()
    result = _hfx_run(folder, "--generate", "--input-ids", ",".join(map(str, prompt)), "--max-new-tokens", 8)
    assert result.returncode == 0, result.stderr
    assert [int(i) for i in re.search(r"^ids: (\S+)$", result.stdout, re.M).group(1).split(",")] == python_ids
    assert len(set(python_ids[len(prompt):])) > 1
