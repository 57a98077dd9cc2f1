"""DynamoExporter on the real MiniLM and on small modules: signature restore, static-axis report,
state cleanup, pytree round trip of caches, concurrent exports."""

import gc
import itertools
import re
import threading

import pytest
import torch
import transformers

from hf_exporters import DynamoConfig, DynamoExporter, ExportStageError
from hf_exporters.errors import InputError, ParityError
from hf_exporters.exporters._common import _STATEFUL_CACHE_ATTRS
from hf_exporters.pipeline import default_model_path
from hf_exporters.runtime import ExportedProgramRunner, check_parity, resized_inputs
from hf_exporters.shapes import StaticAxis
from config_models import build, example_inputs
from workaround_helpers import without_workarounds


@pytest.fixture(scope="module")
def minilm():
    path = default_model_path()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModel.from_pretrained(path).eval()
    return model, tokenizer


def test_minilm_batch_encoding_dynamic_parity(minilm):
    model, tokenizer = minilm
    encoding = tokenizer(["A man is eating food.", "Someone is riding a horse in the field."], padding=True, return_tensors="pt")
    assert isinstance(encoding, transformers.BatchEncoding)
    exporter = DynamoExporter()
    result = exporter.run(model, encoding, DynamoConfig(dynamic=True))
    program = result.program
    assert result.static_axes == []
    assert "forward" not in vars(model)  # the signature patch is an instance attribute, removed afterwards
    inputs = dict(encoding)
    other = resized_inputs(program, inputs)
    assert other["input_ids"].shape == (5, inputs["input_ids"].shape[1] + 3)
    reports = check_parity(model, ExportedProgramRunner(program), [inputs, other], atol=1e-4)
    assert [r.ok for r in reports] == [True, True]
    assert max(r.max_abs_diff for r in reports) < 1e-5
    # real sentences embed to the checkpoint's known geometry: similar sentences are closer
    with torch.no_grad():
        out = program.module()(**dict(tokenizer(["A man eats food.", "A man is eating a meal.", "The sky is blue."], padding=True, return_tensors="pt")))
    emb = torch.nn.functional.normalize(out.last_hidden_state.mean(1), dim=-1)
    assert float(emb[0] @ emb[1]) > float(emb[0] @ emb[2])


def test_static_export_refuses_other_sizes_with_a_clear_guard(minilm):
    model, tokenizer = minilm
    inputs = dict(tokenizer(["hello world"], return_tensors="pt"))
    program = DynamoExporter().export(model, inputs)
    longer = dict(tokenizer(["hello world, a longer sentence"], return_tensors="pt"))
    with pytest.raises(AssertionError, match=r"^Guard failed: input_ids.size\(\)\[1\] == 4$"):
        program.module()(**longer)


class _ViewsBatchAsTwo(torch.nn.Module):
    def forward(self, x):
        return x.reshape(2, -1).sum(-1)


def test_axes_that_end_static_are_reported():
    exporter = DynamoExporter()
    result = exporter.run(torch.nn.Linear(3, 4), {"input": torch.randn(2, 3)}, DynamoConfig(dynamic=True))
    assert result.static_axes == [StaticAxis("input", 1, 3)]  # the feature axis meets the weight
    assert str(result.static_axes[0]) == "input[axis 1] = 3"


def test_explicit_dynamic_shapes_take_precedence():
    exporter = DynamoExporter()
    result = exporter.run(
        _ViewsBatchAsTwo(),
        {"x": torch.randn(2, 3)},
        DynamoConfig(dynamic=True, dynamic_shapes={"x": {1: torch.export.Dim("n")}}),
    )
    program = result.program
    shape = [n for n in program.graph.nodes if n.name == "x"][0].meta["val"].shape
    assert shape[0] == 2 and isinstance(shape[1], torch.SymInt)
    assert result.static_axes == []


class _CachesRotary(torch.nn.Module):
    """Sets a tensor attribute in forward, as wav2vec2-bert's rotary embedding does."""

    def __init__(self):
        super().__init__()
        self.cached_rotary_positional_embedding = None
        self.cached_sequence_length = None

    def forward(self, x):
        if self.cached_rotary_positional_embedding is None or self.cached_sequence_length != x.shape[1]:
            self.cached_rotary_positional_embedding = torch.arange(x.shape[1], dtype=x.dtype)
            self.cached_sequence_length = x.shape[1]
        return x + self.cached_rotary_positional_embedding


def test_state_cleanup_restores_stateful_attributes():
    assert "cached_rotary_positional_embedding" in _STATEFUL_CACHE_ATTRS
    module = _CachesRotary()
    module(torch.zeros(1, 3))
    eager_table = module.cached_rotary_positional_embedding
    program = DynamoExporter().export(module, {"x": torch.zeros(1, 4)})
    assert module.cached_rotary_positional_embedding is eager_table  # not a traced tensor
    assert module.cached_sequence_length == 3
    assert torch.equal(module(torch.zeros(1, 4)), program.module()(x=torch.zeros(1, 4)))


def test_trace_failure_is_a_stage_error_with_the_blamed_line():
    class DataDependent(torch.nn.Module):
        def forward(self, x):
            if x.sum() > 0:  # the blamed line
                return x * 2
            return x

    with pytest.raises(ExportStageError) as info:
        DynamoExporter().export(DataDependent(), {"x": torch.ones(3)})
    error = info.value
    assert error.exporter == "dynamo" and error.stage == "trace (torch.export.export)"
    assert error.blamed.endswith("(forward: if x.sum() > 0:  # the blamed line)")
    assert str(error).startswith("[dynamo] trace (torch.export.export) failed: ")


_FREEZE_COUNTS: list[int] = []  # outside the module: the trace restores the module's own attributes


class _SeesFrozenObjects(torch.nn.Module):
    """Records in ``_FREEZE_COUNTS``, while it is traced, how many objects the collector leaves out;
    ``fail`` makes the trace fail."""

    def __init__(self, fail: bool = False):
        super().__init__()
        self.fail = fail

    def forward(self, x):
        _FREEZE_COUNTS.append(gc.get_freeze_count())
        if self.fail and x.sum() > 0:
            return x
        return x * 2


def test_objects_older_than_an_export_are_left_out_of_collections_during_it_only():
    assert gc.get_freeze_count() == 0
    _FREEZE_COUNTS.clear()
    DynamoExporter().export(_SeesFrozenObjects(), {"x": torch.ones(3)})
    assert _FREEZE_COUNTS and min(_FREEZE_COUNTS) > 0  # the process's objects, frozen for the trace
    assert gc.get_freeze_count() == 0  # and given back to the collector
    _FREEZE_COUNTS.clear()
    with pytest.raises(ExportStageError):
        DynamoExporter().export(_SeesFrozenObjects(fail=True), {"x": torch.ones(3)})
    assert _FREEZE_COUNTS and min(_FREEZE_COUNTS) > 0 and gc.get_freeze_count() == 0  # a failed export too


def test_a_process_that_froze_its_objects_keeps_them_frozen_and_a_disabled_collector_stays_untouched():
    marker = [[]]  # a container the collector tracks; get_objects() lists it only while it is not frozen
    gc.freeze()
    try:
        DynamoExporter().export(_SeesFrozenObjects(), {"x": torch.ones(3)})
        assert not any(o is marker for o in gc.get_objects())  # still frozen: the export did not unfreeze it
    finally:
        gc.unfreeze()
    _FREEZE_COUNTS.clear()
    gc.disable()
    try:
        DynamoExporter().export(_SeesFrozenObjects(), {"x": torch.ones(3)})
    finally:
        gc.enable()
    assert _FREEZE_COUNTS and set(_FREEZE_COUNTS) == {0}


def test_inputs_must_be_a_mapping():
    with pytest.raises(InputError, match="inputs must be a mapping of forward keyword arguments, got list"):
        DynamoExporter().export(_ViewsBatchAsTwo(), [torch.randn(2, 3)])


def test_dynamic_cache_round_trips_through_save_and_load(tmp_path):
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        cache = model(input_ids=torch.randint(0, 64, (1, 3)), use_cache=True).past_key_values
    inputs = {"input_ids": torch.randint(0, 64, (1, 1)), "past_key_values": cache}
    exporter = DynamoExporter()
    program = exporter.export(model, inputs, DynamoConfig(dynamic=True))
    path = exporter.save(program, tmp_path)
    assert path.name == "model.pt2" and program.example_inputs is not None
    runner = exporter.load_runner(path)
    report = check_parity(model, runner, [inputs], atol=1e-4)[0]
    assert report.ok and [leaf.name for leaf in report.leaves][:2] == ["logits", "past_key_values_0"]


def test_concurrent_exports_in_threads(minilm):
    """Exports in three threads at once: each sees its own, complete set of patches (the lock
    serialises the patched regions), and every program matches eager."""
    model, tokenizer = minilm
    inputs = dict(tokenizer(["one sentence", "and another one"], padding=True, return_tensors="pt"))
    programs, errors = [], []

    def work(dynamic):
        try:
            programs.append(DynamoExporter().export(model, inputs, DynamoConfig(dynamic=dynamic)))
        except Exception as error:  # noqa: BLE001
            errors.append(error)

    threads = [threading.Thread(target=work, args=(d,)) for d in (True, False, True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(programs) == 3
    diffs = [check_parity(model, ExportedProgramRunner(p), [inputs], atol=1e-4)[0].max_abs_diff for p in programs]
    assert max(diffs) < 1e-5


class _CastsItsClassifier(torch.nn.Module):
    """A router that casts its classifier in forward, as SwitchTransformers' does."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.classifier = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.classifier = self.classifier.to(torch.float32)
        return self.classifier(x).softmax(-1)


def test_patch_module_to_noop(tmp_path):
    from hf_exporters import registry

    model, inputs = _CastsItsClassifier(), {"x": torch.randn(2, 4)}
    with without_workarounds("_patch_module_to_noop"):
        with pytest.raises(ExportStageError, match="Couldn't swap Linear.weight"):
            DynamoExporter().export(model, inputs)
    exporter = DynamoExporter()
    program = exporter.export(model, inputs)
    runner = exporter.load_runner(exporter.save(program, tmp_path))
    (report,) = check_parity(model, runner, [inputs], atol=1e-6)
    assert report.max_abs_diff == 0.0
    assert torch.nn.Module.to.__qualname__ == "Module.to"  # restored after the trace
    # a real cast still goes through Module.to (and is not a no-op)
    with registry.apply_patches("dynamo"):
        assert model.to(torch.float64).classifier.weight.dtype == torch.float64


def _qwen2_vl_vision_tower():
    """A tiny Qwen2-VL vision tower and two images of different grids packed into one sequence."""
    config = transformers.Qwen2VLConfig(
        vision_config={"depth": 2, "embed_dim": 32, "hidden_size": 32, "num_heads": 4, "mlp_ratio": 2,
                       "patch_size": 4, "spatial_merge_size": 2, "temporal_patch_size": 2, "in_channels": 3},
    ).vision_config
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    tower = transformers.models.qwen2_vl.modeling_qwen2_vl.Qwen2VisionTransformerPretrainedModel(config).eval()
    grid = torch.tensor([[1, 4, 4], [2, 2, 4]])  # 16 + 16 patches, in three attention pieces
    patches = torch.randn(int(grid.prod(-1).sum()), 3 * 2 * 4 * 4, generator=torch.Generator().manual_seed(0))
    return tower, {"hidden_states": patches, "grid_thw": grid}


@pytest.mark.canary
def test_varlen_vision_attention_is_refused_without_the_block_mask():
    tower, inputs = _qwen2_vl_vision_tower()
    with without_workarounds("_patch_varlen_attention_as_block_mask"):
        with pytest.raises(ExportStageError, match=r"Could not guard on data-dependent expression Eq\(u\d+, 0\)"):
            DynamoExporter().export(tower, inputs)


def test_varlen_vision_attention_exports_as_one_block_diagonal_call(tmp_path):
    """Packed pieces split with ``lengths.tolist()`` stop the trace (the canary tier's
    test_varlen_vision_attention_is_refused_without_the_block_mask); one block-diagonal SDPA call
    gives the per-piece numbers and exports."""
    from hf_exporters.workarounds.dynamo.attention import _block_diagonal_sdpa

    # the mask keeps each packed piece to itself: same numbers as one SDPA call per piece
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 7, 8) for _ in range(3))
    cu = torch.tensor([0, 3, 4, 7], dtype=torch.int32)
    out, _ = _block_diagonal_sdpa(torch.nn.Module(), q, k, v, None, cu_seq_lens_q=cu, cu_seq_lens_k=cu)
    pieces = [torch.nn.functional.scaled_dot_product_attention(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b]) for a, b in ((0, 3), (3, 4), (4, 7))]
    assert torch.allclose(out, torch.cat(pieces, dim=2).transpose(1, 2), atol=1e-6)
    # causal, with query pieces shorter than their key pieces: flash varlen's bottom-right alignment
    cu_q, cu_k = torch.tensor([0, 2, 4], dtype=torch.int32), torch.tensor([0, 3, 7], dtype=torch.int32)
    q2 = torch.randn(1, 2, 4, 8)
    out, _ = _block_diagonal_sdpa(torch.nn.Module(), q2, k, v, None, is_causal=True, cu_seq_lens_q=cu_q, cu_seq_lens_k=cu_k)
    pieces = []
    for (qa, qb), (ka, kb) in (((0, 2), (0, 3)), ((2, 4), (3, 7))):
        allowed = torch.arange(kb - ka)[None, :] <= torch.arange(qb - qa)[:, None] + (kb - ka) - (qb - qa)
        pieces.append(torch.nn.functional.scaled_dot_product_attention(q2[:, :, qa:qb], k[:, :, ka:kb], v[:, :, ka:kb], attn_mask=allowed))
    assert torch.allclose(out, torch.cat(pieces, dim=2).transpose(1, 2), atol=1e-6)

    tower, inputs = _qwen2_vl_vision_tower()
    attention = type(tower.blocks[0].attn)
    original = attention.forward
    exporter = DynamoExporter()
    program = exporter.export(tower, inputs)
    runner = exporter.load_runner(exporter.save(program, tmp_path))
    (report,) = check_parity(tower, runner, [inputs], atol=1e-5)
    assert report.ok and report.max_abs_diff < 1e-5
    assert attention.forward is original and tower.config._attn_implementation == "sdpa"  # restored


def test_varlen_patch_lists_every_split_per_piece_attention():
    """Every attention forward of the installed transformers that splits a packed sequence with
    ``lengths.tolist()`` (and has a varlen flash branch) is covered by the block-diagonal patch."""
    import ast
    import pathlib

    from hf_exporters.workarounds.dynamo.attention import _VARLEN_ATTENTION_FORWARDS

    found = set()
    for path in sorted((pathlib.Path(transformers.__file__).parent / "models").glob("*/modeling_*.py")):
        source = path.read_text()
        if "lengths.tolist()" not in source:
            continue
        for owner in ast.parse(source).body:
            if not isinstance(owner, ast.ClassDef):
                continue
            for method in owner.body:
                segment = ast.get_source_segment(source, method) if isinstance(method, ast.FunctionDef) and method.name == "forward" else ""
                if "lengths.tolist()" in segment and "is_flash_attention_requested" in segment:
                    found.add(f"transformers.models.{path.parent.name}.{path.stem}.{owner.name}.forward")
    assert len(found) >= 30
    assert sorted(found - set(_VARLEN_ATTENTION_FORWARDS)) == []


_DATA_DEPENDENT = "Could not guard on data-dependent expression"
_SPECIALIZED = "Could not extract specialized integer from data-dependent expression"

#: (tiny family, the workarounds it needs, dynamic, what the trace says without them). The canary tier
#: exports each family without its workarounds (test_refused_without_the_workaround): an upstream fix
#: then shows up as a refusal that no longer happens. The fast tier exports each with them.
REFUSED_WITHOUT = [
    # mixture-of-experts loops over the experts hit (nonzero() of the routing mask)
    ("OpenAIPrivacyFilterModel", ("_patch_eager_experts_as_batched_mm",), False, _DATA_DEPENDENT),
    ("SwitchTransformersModel", ("_patch_switch_experts_dense",), False, _DATA_DEPENDENT),
    ("DbrxModel", ("_patch_dbrx_experts_dense",), False, _DATA_DEPENDENT),
    ("Step3p7Model", ("_patch_step3p7_experts_dense",), False, _DATA_DEPENDENT),
    ("LongcatFlashModel", ("_patch_longcat_flash_experts_dense",), False, _DATA_DEPENDENT),
    ("FSMTModel", ("_patch_fsmt_padding_mask_always",), False, _DATA_DEPENDENT),
    ("UdopModel", ("_patch_udop_combine_without_ragged_rows",), False, "its data is not allocated yet"),
    # vision towers reading each image's grid as Python ints
    ("Qwen2_5_VisionTransformerPretrainedModel", ("_patch_vision_window_index_by_sort",), False, _SPECIALIZED),
    ("MiniCPMOcrVisionModel", ("_patch_vision_nearest_position_ids_symbolic",), False, _SPECIALIZED),
    ("MuseSparkVisionModel", ("_patch_vision_pixel_shuffle_index_symbolic",), False, _SPECIALIZED),
    ("Cosmos3EdgeVisionModel", ("_patch_cosmos3_edge_grid_sides_checked",), False, r"Could not guard on data-dependent expression u\d+ > 0"),
    ("Kimi_K25VisionModel", ("_patch_kimi_frame_index_symbolic", "_patch_kimi_temporal_merge_index_symbolic"), True, "data-dependent"),
    ("VideoLlama3VisionModel", ("_patch_videollama3_pixel_unshuffle_gathered",), True, "data-dependent"),
    ("Qwen3ASREncoder", ("_patch_audio_window_cu_seqlens_symbolic",), False, _SPECIALIZED),
    ("AutoformerModel", ("_patch_skip_bidirectional_mask_without_padding",), False, re.escape("shape '[2, 2, 4, 4]' is invalid for input of size 512")),
    ("EncodecModel", ("_patch_encodec_conv_padding_from_ints",), False, _DATA_DEPENDENT),
    ("FastSpeech2ConformerModel",
     ("_patch_fastspeech2_length_regulator_gathered", "_patch_fastspeech2_relative_table_bounded", "_patch_relative_shift_gathered"),
     True, "GuardOnDataDependentSymNode"),
]


@pytest.mark.canary
@pytest.mark.parametrize("model_class, workarounds, dynamic, refusal", REFUSED_WITHOUT, ids=[row[0] for row in REFUSED_WITHOUT])
def test_refused_without_the_workaround(model_class, workarounds, dynamic, refusal):
    """Each family's export stops in the trace without its workarounds, on the error ``refusal`` names."""
    model = build(model_class)
    inputs = example_inputs(model)
    with without_workarounds(*workarounds):
        with pytest.raises(ExportStageError, match=refusal) as failed:
            DynamoExporter().export(model, inputs, DynamoConfig(dynamic=dynamic))
    assert failed.value.stage == "trace (torch.export.export)"


def _tiny_exported(model_class, dynamic=False):
    """The tiny ``model_class`` of tests/configs and its inputs, exported with every workaround;
    returns (model, inputs, exporter, program)."""
    model = build(model_class)
    inputs = example_inputs(model)
    exporter = DynamoExporter()
    return model, inputs, exporter, exporter.export(model, inputs, DynamoConfig(dynamic=dynamic))


@pytest.mark.parametrize(
    "model_class",
    ["OpenAIPrivacyFilterModel", "SwitchTransformersModel", "DbrxModel", "Step3p7Model", "LongcatFlashModel"],
)
def test_expert_loops_over_data_export_with_eager_numbers(tmp_path, model_class):
    """Mixture-of-experts layers that loop over the experts hit (``nonzero()`` of the routing mask)
    fail the trace on a data-dependent guard (the canary's REFUSED_WITHOUT); with the workaround they
    export with eager's numbers. OpenAI Privacy Filter defaults its experts to that eager loop and is
    traced with transformers' batched_mm experts; SwitchTransformers, DBRX, Step 3.7 and LongCat-Flash
    (with its identity experts) write their own loops and become dense mixtures."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    model, inputs, exporter, program = _tiny_exported(model_class)
    (report,) = check_parity(model, exporter.load_runner(exporter.save(program, tmp_path)), [inputs], atol=1e-4)
    assert report.ok and report.max_abs_diff < 1e-5
    assert ALL_EXPERTS_FUNCTIONS.get_interface("eager", None) is None  # restored after the export


@pytest.mark.canary
def test_bf16_privacy_filter_keeps_its_expert_loop():
    """OpenAI Privacy Filter's eager loop computes in float32 whatever the weights' dtype; batched_mm
    would not, so a bf16 model keeps the loop (and the trace still stops on it)."""
    model = build("OpenAIPrivacyFilterModel")
    inputs = example_inputs(model)
    with pytest.raises(ExportStageError, match=_DATA_DEPENDENT):
        DynamoExporter().export(model.to(torch.bfloat16), inputs)


def test_fsmt_padding_mask_without_the_any_branch(tmp_path):
    """FSMT drops its padding mask when no token is padding (``if not padding_mask.any()``), a branch on
    the token ids; the program keeps an all-False mask instead, which masks nothing: eager's numbers
    on inputs with and without padding."""
    model, inputs, exporter, program = _tiny_exported("FSMTModel")
    pad = model.config.pad_token_id
    assert not bool((inputs["input_ids"] == pad).any())
    padded = {k: v.clone() for k, v in inputs.items()}
    padded["input_ids"][0, -3:] = pad
    padded["decoder_input_ids"][1, -2:] = pad
    padded["attention_mask"][0, -3:] = 0
    reports = check_parity(model, exporter.load_runner(exporter.save(program, tmp_path)), [inputs, padded], atol=1e-4)
    assert [r.ok for r in reports] == [True, True]
    assert max(r.max_abs_diff for r in reports) < 1e-5


def test_udop_merges_image_and_text_without_ragged_rows(tmp_path):
    """UDOP keeps, per row, the image patches no OCR box centre falls in (a data-dependent count) and
    pads them back; the patch builds the same rows by scattering each kept patch to its rank."""
    model, inputs, exporter, program = _tiny_exported("UdopModel")
    other = {k: v.clone() for k, v in inputs.items()}
    other["bbox"] = torch.rand(other["bbox"].shape, generator=torch.Generator().manual_seed(3)).sort(-1).values  # other boxes, other patches
    other["bbox"][1, :2] = 0.0  # empty boxes (special tokens) add no image embedding
    reports = check_parity(model, exporter.load_runner(exporter.save(program, tmp_path)), [inputs, other], atol=1e-4)
    assert [r.ok for r in reports] == [True, True]
    assert max(r.max_abs_diff for r in reports) < 1e-5


@pytest.mark.canary
def test_sdpa_with_sizes_read_from_data_takes_the_math_backend(tmp_path, monkeypatch):
    """SAM 3's attention mask spans image tokens counted from the data; CPU SDPA's kernel choice
    compares that size with the key length and stops the trace, the math kernel does not; the
    program records that kernel, so its decomposition (ONNX, ExecuTorch) needs no choice either.
    (The fast tier's test_sdpa_over_sizes_read_from_data_is_the_math_kernel shows it on a tiny module.)"""
    from hf_exporters.workarounds.dynamo import attention

    model = build("Sam3LiteTextModel")
    inputs = example_inputs(model)
    with monkeypatch.context() as patched:
        patched.setattr(attention, "_has_data_dependent_sizes", lambda *tensors: False)
        with pytest.raises(ExportStageError, match=r"Could not guard on data-dependent expression Eq\(u0\*u1, 4\)"):
            DynamoExporter().export(model, inputs)
    exporter = DynamoExporter()
    program = exporter.export(model, inputs)
    (report,) = check_parity(model, exporter.load_runner(exporter.save(program, tmp_path)), [inputs], atol=1e-4)
    assert report.ok and report.max_abs_diff < 1e-5
    program.run_decompositions()  # the lowerings' re-trace meets no kernel choice


class _UnfoldsPatches(torch.nn.Module):
    """MobileViTV2's pattern: stride-2 convolutions, then patches unfolded and folded back (2 x 2)."""

    def __init__(self):
        super().__init__()
        self.convs = torch.nn.ModuleList(torch.nn.Conv2d(3 if i == 0 else 4, 4, 3, stride=2, padding=1) for i in range(5))

    def forward(self, pixel_values):
        x = pixel_values
        for i, conv in enumerate(self.convs):
            x = conv(x)
            if i >= 2:
                b, c, h, w = x.shape
                patches = torch.nn.functional.unfold(x, kernel_size=(2, 2), stride=(2, 2)).reshape(b, c, 4, -1) * 2
                x = torch.nn.functional.fold(patches.reshape(b, c * 4, -1), output_size=(h, w), kernel_size=(2, 2), stride=(2, 2))
        return x


def test_guards_the_constraint_solver_cannot_solve_do_not_stop_a_dynamic_export():
    """MobileViTV2's patch unfolding over a dynamic image side leaves a floor-division guard that
    sympy cannot solve; without the solver patch the size-oblivious trace fails on it, with it the
    program keeps the guard and runs other sides, traced the first time."""
    torch.manual_seed(0)
    model = _UnfoldsPatches().eval()
    inputs = {"pixel_values": torch.randn(2, 3, 64, 64)}
    from hf_exporters.shapes import auto_dynamic_shapes, size_oblivious_sizes

    # the exporter's first trace, without the solver patch (a plain-reasoning retry would hide it)
    with size_oblivious_sizes(), pytest.raises(Exception, match="cannot be solved using"):
        torch.export.export(model, (), inputs, dynamic_shapes=auto_dynamic_shapes(inputs), strict=False)
    exporter = DynamoExporter()
    result = exporter.run(model, inputs, DynamoConfig(dynamic=True))
    program = result.program
    assert result.size_oblivious is True  # no retry needed
    assert result.static_axes == [StaticAxis("pixel_values", 1, 3)]  # the channels meet the first convolution
    others = [{"pixel_values": torch.randn(3, 3, 96, 64)}, {"pixel_values": torch.randn(4, 3, 64, 96)}]  # sides up to 96
    reports = check_parity(model, ExportedProgramRunner(program), [inputs, *others], atol=1e-5)
    assert [r.ok for r in reports] == [True, True, True]


def test_window_index_by_sort_equals_transformers():
    """The sorted-key window order and the clipped window lengths equal ``get_vision_window_index``
    exactly (values and dtypes) on grids that fill windows, cut them short and hold several frames."""
    import itertools

    from transformers.vision_utils import get_vision_window_index

    from hf_exporters.workarounds.dynamo.vision import _window_index_by_sort

    cases = [((2, 112, 14), [(1, 2, 2), (2, 4, 6), (1, 8, 8), (3, 6, 2), (1, 14, 10)]), ((1, 4, 1), [(1, 3, 5), (1, 4, 4), (2, 7, 3)])]
    for (merge, window, patch), grids in cases:
        for pair in itertools.product(grids, repeat=2):
            grid = torch.tensor(pair)
            want, got = get_vision_window_index(grid, merge, window, patch), _window_index_by_sort(grid, merge, window, patch)
            assert all(torch.equal(w, g) and w.dtype == g.dtype for w, g in zip(want, got)), pair


def test_pixel_shuffle_index_equals_transformers():
    """The block-order gather index equals Muse Spark's loop over the images exactly, for merge sizes
    1 and 2, single images and pairs, one frame and several."""
    import itertools

    from transformers.models.muse_spark.modeling_muse_spark import get_vision_pixel_shuffle_index

    from hf_exporters.workarounds.dynamo.vision import _pixel_shuffle_index

    for merge, grids in ((1, [(1, 3, 5), (2, 2, 2)]), (2, [(1, 4, 4), (2, 4, 6), (3, 2, 4), (1, 6, 2)])):
        for count in (1, 2):
            for grid in itertools.product(grids, repeat=count):
                want, got = get_vision_pixel_shuffle_index(torch.tensor(grid), merge), _pixel_shuffle_index(torch.tensor(grid), merge)
                assert torch.equal(want, got) and want.dtype == got.dtype, grid


@pytest.mark.parametrize(
    "model_class, grid_name, others",
    [
        # the window index the fast tier checks against transformers' (test_window_index_by_sort_equals_transformers)
        pytest.param("Qwen2_5_VisionTransformerPretrainedModel", "grid_thw", ([[1, 2, 8]], [[2, 2, 4]]), marks=pytest.mark.canary),
        ("MiniCPMOcrVisionModel", "target_sizes", ([[2, 8], [8, 2]], [[8, 2], [4, 4]])),
        ("MuseSparkVisionModel", "grid_thw", ([[1, 2, 8]], [[2, 2, 4]])),
        ("Cosmos3EdgeVisionModel", "grid_thw", ([[1, 2, 8]], [[2, 2, 4]])),
    ],
)
def test_vision_grid_helpers_keep_sizes_symbolic(tmp_path, model_class, grid_name, others):
    """Vision towers that read each image's grid as Python ints stop the trace even in a static export
    (the canary's REFUSED_WITHOUT); with the sizes kept symbolic the program reads the grid at run time:
    eager's numbers on the traced grid and on other grids of the same patch count."""
    model, inputs, exporter, program = _tiny_exported(model_class)
    sets = [inputs] + [{**inputs, grid_name: torch.tensor(grid, dtype=inputs[grid_name].dtype)} for grid in others]
    assert int(inputs[grid_name].prod(-1).sum()) == int(sets[1][grid_name].prod(-1).sum())
    reports = check_parity(model, exporter.load_runner(exporter.save(program, tmp_path)), sets, atol=1e-4)
    assert [r.ok for r in reports] == [True] * 3, [r.describe_failure() for r in reports if not r.ok]
    assert max(r.max_abs_diff for r in reports) < 1e-5


class _KeptTokensAttention(torch.nn.Module):
    """Attention over the tokens a mask keeps (their count read from the data), each token attending
    within its segment: a boolean mask over a data-dependent length."""

    def forward(self, x: torch.Tensor, keep: torch.Tensor, segments: torch.Tensor) -> torch.Tensor:
        from hf_exporters.workarounds.dynamo.attention import _export_safe_sdpa

        tokens, kept_segments = x[keep], segments[keep]
        mask = (kept_segments[:, None] == kept_segments[None, :])[None, None]
        out, _ = _export_safe_sdpa(self, tokens[None, None], tokens[None, None], tokens[None, None], mask, is_causal=False)
        return out.sum(dim=(0, 1))


def test_boolean_mask_over_sizes_read_from_data_masks():
    """SDPA over sizes read from the data is recorded as the math kernel, which adds its mask: a
    boolean mask must reach it as 0 / -inf. Traced with one segment (all True), the program gives
    eager's numbers on two segments too (adding the boolean mask left the attention unmasked)."""
    torch.manual_seed(0)
    model = _KeptTokensAttention()
    keep = torch.tensor([True, True, False, True, True, True])
    inputs = {"x": torch.randn(6, 4), "keep": keep, "segments": torch.zeros(6, dtype=torch.long)}
    program = DynamoExporter().export(model, inputs)
    two = {**inputs, "segments": torch.tensor([0, 0, 0, 1, 1, 1])}
    unmasked = model(**inputs).clone()
    reports = check_parity(model, ExportedProgramRunner(program), [inputs, two], atol=1e-6)
    assert [r.ok for r in reports] == [True, True], [r.describe_failure() for r in reports if not r.ok]
    assert (model(**two) - unmasked).abs().max() > 0.1  # the second set's mask matters


def test_sdpa_over_sizes_read_from_data_is_the_math_kernel(monkeypatch):
    """CPU SDPA picks its kernel by comparing sizes, which stops the trace when a size was read from
    the data; recorded as the math kernel, the call exports and the lowerings' re-trace (ONNX,
    ExecuTorch) meets no kernel choice either."""
    from hf_exporters.workarounds.dynamo import attention

    model = _KeptTokensAttention()
    inputs = {"x": torch.randn(6, 4), "keep": torch.tensor([True, True, False, True, True, True]), "segments": torch.zeros(6, dtype=torch.long)}
    with monkeypatch.context() as patched:
        patched.setattr(attention, "_has_data_dependent_sizes", lambda *tensors: False)
        with pytest.raises(ExportStageError, match=re.escape("Could not guard on data-dependent expression Eq(u0, 0)")):
            DynamoExporter().export(model, inputs)
    program = DynamoExporter().export(model, inputs)
    targets = [node.target for node in program.graph.nodes if node.op == "call_function"]
    assert torch.ops.aten._scaled_dot_product_attention_math.default in targets
    assert torch.ops.aten.scaled_dot_product_attention.default not in targets
    decomposed = program.run_decompositions()
    torch.testing.assert_close(decomposed.module()(**inputs), model(**inputs))


class _BranchesOnTracing(torch.nn.Module):
    """Attention over 3 positions, causal only when traced: transformers' causal-mask skip in small. Eager
    passes no mask to a module that is not causal (every position attends to every one); under tracing the
    causal mask is built and applied."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = torch.ones(3, 3, dtype=torch.bool).tril() if torch.compiler.is_compiling() else None
        return torch.nn.functional.scaled_dot_product_attention(x, x, x, attn_mask=mask)


def test_parity_failure_names_a_model_that_branches_on_tracing():
    model = _BranchesOnTracing()
    x = torch.arange(12.0).reshape(1, 1, 3, 4) / 10
    runner = ExportedProgramRunner(DynamoExporter().export(model, {"x": x}))
    with pytest.raises(ParityError) as failure:
        check_parity(model, runner, [{"x": x}], atol=1e-5)
    assert str(failure.value) == (
        "outputs differ from eager beyond atol=1e-05 for inputs {'x': [1, 1, 3, 4]}: : max abs diff 0.432 (the model "
        "computes differently when traced: eager run as under torch.export (torch.compiler.is_compiling() true) differs "
        "from plain eager by 0.432, and the artifact matches that traced path within 0; the model code branches on "
        "tracing (in transformers, an is_tracing() branch such as the causal-mask skip, which leaves a non-causal "
        "attention module unmasked in eager only))"
    )
    # a plain numeric mismatch carries no such note
    wrong = ExportedProgramRunner(DynamoExporter().export(_Scaled(2.0), {"x": x}))
    with pytest.raises(ParityError) as plain:
        check_parity(_Scaled(3.0), wrong, [{"x": x}], atol=1e-5)
    assert "traced" not in str(plain.value)
    assert torch.compiler.is_compiling() is False  # the rerun's patch is undone


class _Scaled(torch.nn.Module):
    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor


def test_audio_window_cu_seqlens_equal_transformers():
    """The windows as tensor ops give transformers' boundaries exactly: full windows, a remainder, an
    empty sample, several chunks per sample."""
    from transformers.models.qwen3_asr import modeling_qwen3_asr

    from hf_exporters.workarounds.dynamo.audio import _patch_audio_window_cu_seqlens_symbolic

    original = modeling_qwen3_asr.get_audio_cu_seqlens
    patched = _patch_audio_window_cu_seqlens_symbolic(original)
    for n_window, n_window_infer, mask_lengths in ((50, 800, [100, 100]), (4, 16, [40, 0, 17, 33]), (4, 8, [8, 5, 16]), (2, 4, [1, 9])):
        chunk = 2 * n_window
        chunks = max(-(-length // chunk) for length in mask_lengths) or 1
        feature_lens = torch.tensor(mask_lengths)
        chunk_lengths = torch.stack([(length - torch.arange(chunks) * chunk).clamp(0, chunk) for length in mask_lengths]).reshape(-1)
        want = original(chunk_lengths, feature_lens, n_window_infer, n_window)
        got = patched(chunk_lengths, feature_lens, n_window_infer, n_window)
        assert torch.equal(want, got) and got.dtype == torch.int32, (mask_lengths, want, got)
    precomputed = torch.tensor([0, 3], dtype=torch.int32)
    assert patched(chunk_lengths, feature_lens, 4, 2, kwargs={"cu_seqlens": precomputed}) is precomputed
    unset = {"cu_seqlens": None}  # the key leaves kwargs as in transformers (the layers take cu_seqlens by position)
    assert torch.equal(patched(chunk_lengths, feature_lens, 4, 2, kwargs=unset), original(chunk_lengths, feature_lens, 4, 2)) and unset == {}


def test_audio_encoder_windows_read_from_the_mask(tmp_path):
    """Qwen3-ASR's encoder windows its frames by lengths read from the feature mask; the program reads
    them at run time: eager's numbers on the traced mask and on a padded one of the same shape."""
    model, inputs, exporter, program = _tiny_exported("Qwen3ASREncoder")
    padded = {**inputs, "input_features_mask": inputs["input_features_mask"].clone()}
    padded["input_features_mask"][1, 37:] = 0
    reports = check_parity(model, exporter.load_runner(exporter.save(program, tmp_path)), [inputs, padded], atol=1e-4)
    assert [r.ok for r in reports] == [True, True], [r.describe_failure() for r in reports if not r.ok]
    assert reports[1].leaves[0].shape[0] < reports[0].leaves[0].shape[0]  # fewer frames kept: the mask was read


def test_bidirectional_mask_without_padding_is_skipped_as_in_eager(tmp_path):
    """Called without a padding mask, Autoformer's encoder gets no mask in eager; under export
    transformers builds an all-true one, and Autoformer's autocorrelation cannot add it. With the
    skip taken while tracing too, the program is eager's, and a padding mask still reaches the rule."""
    from transformers import masking_utils

    model, inputs, exporter, program = _tiny_exported("AutoformerModel")
    (report,) = check_parity(model, exporter.load_runner(exporter.save(program, tmp_path)), [inputs], atol=1e-4)
    assert report.ok and report.max_abs_diff < 1e-5
    from hf_exporters.registry import apply_patches

    exporting = masking_utils.is_torchdynamo_exporting
    masking_utils.is_torchdynamo_exporting = lambda: True  # as under torch.export
    try:
        assert masking_utils._ignore_bidirectional_mask_sdpa(None, 8) is False  # transformers' rule
        with apply_patches("dynamo"):
            skip = masking_utils._ignore_bidirectional_mask_sdpa
            assert skip(None, 8) is True
            assert skip(None, 8, 4) is False  # a local window keeps its mask
            assert skip(torch.tensor([[True, False]]), 2) is False  # padding keeps its mask
    finally:
        masking_utils.is_torchdynamo_exporting = exporting
    assert masking_utils._ignore_bidirectional_mask_sdpa.__name__ == "_ignore_bidirectional_mask_sdpa"


_LEN_PROBE = '''
import torch


class PoolByLen(torch.nn.Module):
    def forward(self, x):
        batch_size = len(x)  # as RT-DETR v2, D-FINE, MaskFormer, SeamlessM4T do
        return x.reshape(batch_size, -1).sum(-1), len([x, x])
'''


def test_len_of_a_tensor_in_modeling_code_keeps_the_batch_dynamic(monkeypatch):
    """``len(tensor)`` in a transformers modeling module specialises the batch under torch.export (CPython
    wants a true int); the shadowing ``len`` keeps the symbol there, and nowhere else."""
    import sys
    import types

    name = "transformers.models.hfx_len_probe.modeling_hfx_len_probe"
    module = types.ModuleType(name)
    exec(_LEN_PROBE, vars(module))
    monkeypatch.setitem(sys.modules, name, module)
    inputs = {"x": torch.randn(2, 3, 4)}
    config = DynamoConfig(dynamic=True, dynamic_shapes={"x": {0: torch.export.Dim.AUTO}})
    with without_workarounds("_patch_len_of_tensor_keeps_symbol"):
        exporter = DynamoExporter()
        result = exporter.run(module.PoolByLen(), inputs, config)
        assert result.static_axes == [StaticAxis("x", 0, 2)]
    exporter = DynamoExporter()
    result = exporter.run(module.PoolByLen(), inputs, config)
    program = result.program
    assert result.static_axes == []
    assert "len" not in vars(module)  # the shadow is gone after the export
    bigger = {"x": torch.randn(5, 3, 4)}
    pooled, count = program.module()(**bigger)
    torch.testing.assert_close(pooled, bigger["x"].reshape(5, -1).sum(-1))
    assert count == 2


class _BroadcastsAConfigSizedMask(torch.nn.Module):
    """SegGPT's pattern: a mask sized by the config (4 patches) reshaped to the input's patch grid, its
    leading 1 broadcast over the batch."""

    def forward(self, x):
        _, height, width = x.shape
        mask = torch.ones(4).reshape(-1, height, width)
        return x * (1 - mask) + mask


class _ViewsAsFive(torch.nn.Module):
    def forward(self, x):
        return x.reshape(-1, 5)


class _BranchesOnData(torch.nn.Module):
    def forward(self, x):
        return x + 1 if x.sum() > 0 else x - 1


def test_trace_failing_under_size_oblivious_reasoning_is_retried_with_plain_reasoning(monkeypatch):
    """Size-oblivious reasoning assumes the mask's computed leading size is never 1 and fails the
    broadcast; the retry guards it and the batch stays dynamic. A data-dependent guard is traced once."""
    from hf_exporters.shapes import size_oblivious_sizes

    model, inputs = _BroadcastsAConfigSizedMask(), {"x": torch.randn(2, 2, 2)}
    with size_oblivious_sizes(), pytest.raises(RuntimeError, match=re.escape("must match the size of tensor b ((4//(")):
        torch.export.export(model, (), inputs, dynamic_shapes={"x": {0: torch.export.Dim.AUTO, 1: torch.export.Dim.AUTO, 2: torch.export.Dim.AUTO}}, strict=False)
    exporter = DynamoExporter()
    result = exporter.run(model, inputs, DynamoConfig(dynamic=True))
    program = result.program
    # the batch stays dynamic; the sides are pinned by the reshape's guard on the 4-element mask
    assert result.static_axes == [StaticAxis("x", 1, 2), StaticAxis("x", 2, 2)]
    bigger = torch.randn(5, 2, 2)
    torch.testing.assert_close(program.module()(x=bigger), model(bigger))

    assert result.size_oblivious is False  # a lowering re-traces with plain reasoning too

    calls = []
    export = torch.export.export
    monkeypatch.setattr(torch.export, "export", lambda *a, **k: calls.append(1) or export(*a, **k))
    with pytest.raises(ExportStageError, match="Could not guard on data-dependent expression"):
        DynamoExporter().export(_BranchesOnData(), {"x": torch.randn(2, 3)}, DynamoConfig(dynamic=True))
    assert len(calls) == 1
    with pytest.raises(ExportStageError, match=re.escape("RuntimeError: shape '[-1, 5]' is invalid for input of size s")) as caught:
        DynamoExporter().export(_ViewsAsFive(), {"x": torch.randn(2, 3)}, DynamoConfig(dynamic=True))
    assert len(calls) == 3  # traced twice: it fails with plain reasoning too, and the first error is kept
    (note,) = caught.value.__cause__.__notes__
    assert note.startswith("traced again with plain size reasoning, it failed too: RuntimeError: shape '[-1, 5]' is invalid")


@pytest.mark.canary
def test_encodec_exports_with_the_conv_padding_from_ints(tmp_path):
    """Encodec exports statically with its paddings computed from ints (without them: the canary's
    REFUSED_WITHOUT); the fast tier exports it with a dynamic length
    (test_encodec_keeps_the_waveform_length_dynamic)."""
    model, inputs, exporter, program = _tiny_exported("EncodecModel")
    (report,) = check_parity(model, exporter.load_runner(exporter.save(program, tmp_path)), [inputs], atol=1e-4)
    assert report.ok and report.max_abs_diff < 1e-5


def test_encodec_conv_padding_from_ints():
    """EncodecConv1d keeps its geometry in int64 buffers and reads its paddings back from tensors: the
    reflect-pad branch then guards on unbacked symbols. Computed from the convolution's own ints, the
    padding is eager's for every length, causal or not, reflect or zero (and the model exports:
    test_encodec_exports_with_the_conv_padding_from_ints)."""
    from transformers.models.encodec import modeling_encodec

    from hf_exporters.registry import apply_patches

    model = build("EncodecModel")
    convs = [m for m in model.modules() if isinstance(m, modeling_encodec.EncodecConv1d)]
    geometries = {(c.conv.kernel_size[0], c.conv.stride[0]) for c in convs}
    assert len(geometries) >= 4  # strided and unstrided kernels
    checked = 0
    for conv in convs[:8]:
        for causal in (True, False):
            for mode in ("reflect", "constant"):
                conv.causal, conv.pad_mode = causal, mode
                for length in (1, 2, 5, 13, 64):
                    x = torch.randn(2, conv.conv.in_channels, length)
                    expected = conv(x)
                    with apply_patches("dynamo"):
                        torch.testing.assert_close(conv(x), expected, rtol=0, atol=0)
                    checked += 1
    assert checked == 160

    from transformers.models.mimi import modeling_mimi


    mimi = [m for m in build("MimiModel").modules() if isinstance(m, modeling_mimi.MimiConv1d)]
    for conv in mimi[:6]:
        for causal in (True, False):
            conv.causal = causal
            for length in (1, 3, 16, 33):
                x = torch.randn(2, conv.conv.in_channels, length)
                expected = conv(x)
                with apply_patches("dynamo"):
                    torch.testing.assert_close(conv(x), expected, rtol=0, atol=0)
                    if not causal:
                        with pytest.raises(ValueError, match="`padding_cache` is not supported for non-causal convolutions."):
                            conv(x, padding_cache=object())


class _PadsToWindowsPerStage(torch.nn.Module):
    """Swin's pattern: every stage pads its map to whole 4x4 windows, attends within them (a softmax
    here), crops back, pads to even sides and merges 2x2 neighbours, so each stage's sizes nest the
    last stage's floor divisions."""

    def forward(self, x):
        for _ in range(3):
            b, c, h, w = x.shape
            x = torch.nn.functional.pad(x, (0, (4 - w % 4) % 4, 0, (4 - h % 4) % 4))
            height, width = x.shape[-2:]
            windows = x.reshape(b, c, height // 4, 4, width // 4, 4).permute(0, 2, 4, 1, 3, 5).reshape(-1, c, 16)
            windows = windows.softmax(-1)
            x = windows.reshape(b, height // 4, width // 4, c, 4, 4).permute(0, 3, 1, 4, 2, 5).reshape(b, c, height, width)
            x = torch.nn.functional.pad(x[:, :, :h, :w], (0, w % 2, 0, h % 2))
            x = torch.cat([x[:, :, 0::2, 0::2], x[:, :, 1::2, 1::2]], 1)[:, :c]
        return x


_FRESH = itertools.count()


def _counting_simplify(monkeypatch):
    """Count full ``sympy.simplify`` calls, from an empty sympy cache (a cached FloorDiv is not rebuilt)."""
    import sympy

    sympy.core.cache.clear_cache()
    calls = []
    full = sympy.simplify
    monkeypatch.setattr(sympy, "simplify", lambda expr, *a, **k: calls.append(expr) or full(expr, *a, **k))
    return calls


def test_floor_division_by_a_common_factor_cancels_it_without_sympy_simplify(monkeypatch):
    """``_patch_floordiv_cancels_without_simplify``: ``FloorDiv(s*a + s*b, 2*s)`` cancels ``s``: torch's eval calls ``sympy.simplify`` on each quotient
    (seconds each on a Swin stage's nested sizes), the patch cancels term by term and keeps the full
    simplify for a quotient that leaves a denominator."""
    import sympy
    from torch.utils._sympy import functions

    from hf_exporters import registry

    calls = _counting_simplify(monkeypatch)

    def quotient(tag):  # fresh symbols each time: sympy caches a built FloorDiv by its arguments
        tag = f"{tag}_{next(_FRESH)}"
        s, a, b = sympy.symbols(f"s_{tag} a_{tag} b_{tag}", integer=True, positive=True)
        return functions.FloorDiv(s * functions.FloorDiv(a, 4) + s * b, 2 * s), (a, b)

    built, _ = quotient("plain")
    assert len(calls) == 2  # base / s and divisor / s
    calls.clear()
    with registry.apply_patches("dynamo"):
        assert functions.sympy is not sympy and functions.sympy.Add is sympy.Add
        built, (a, b) = quotient("patched")
        assert calls == []
        assert built == functions.FloorDiv(functions.FloorDiv(a, 4) + b, 2)
        x = sympy.Symbol(f"x_patched_{next(_FRESH)}", integer=True)
        assert functions.sympy.simplify((x + 1) / 2) == x / 2 + sympy.Rational(1, 2)  # not exact: full simplify
        assert len(calls) == 1
    assert functions.sympy is sympy


def test_windows_padded_at_every_stage_trace_without_sympy_simplify(monkeypatch):
    """The three-stage window padding exports with a dynamic map without one full ``sympy.simplify``
    (without the patch: six calls, 29 s of a 34 s trace here) and matches eager at other sides."""
    calls = _counting_simplify(monkeypatch)
    torch.manual_seed(0)
    model = _PadsToWindowsPerStage().eval()
    inputs = {"x": torch.randn(2, 3, 61, 47)}
    exporter = DynamoExporter()
    result = exporter.run(model, inputs, DynamoConfig(dynamic=True))
    program = result.program
    assert calls == []
    assert result.static_axes == []
    others = [{"x": torch.randn(1, 3, 30, 77)}, {"x": torch.randn(3, 3, 64, 64)}]
    reports = check_parity(model, ExportedProgramRunner(program), [inputs, *others], atol=1e-6)
    assert [r.ok for r in reports] == [True, True, True]


def test_loading_a_dynamic_program_parses_each_size_expression_once(tmp_path, monkeypatch):
    """A dynamic program's saved sizes repeat the same expressions over every node; the load patch
    parses each (expression, hint) once, and the loaded program keeps its ranges and its numbers."""
    from torch._export.serde import serialize

    from hf_exporters.exporters.dynamo import load_exported_program

    torch.manual_seed(0)
    model = _PadsToWindowsPerStage().eval()
    inputs = {"x": torch.randn(2, 3, 61, 47)}
    path = DynamoExporter().save(DynamoExporter().export(model, inputs, DynamoConfig(dynamic=True)), tmp_path / "windows")
    strings = []
    original = serialize.GraphModuleDeserializer._parse_sym_expr
    monkeypatch.setattr(
        serialize.GraphModuleDeserializer,
        "_parse_sym_expr",
        lambda self, expr, hint=None: (strings.append((expr, hint)) if isinstance(expr, str) else None) or original(self, expr, hint),
    )
    with without_workarounds("_patch_parse_each_size_expression_once"):
        plain = load_exported_program(path)
    parsed_plain = list(strings)
    strings.clear()
    loaded = load_exported_program(path)
    assert len(strings) == len(set(strings)) == len(set(parsed_plain)) < len(parsed_plain)
    assert serialize.GraphModuleDeserializer._parse_sym_expr.__name__ == "<lambda>"  # restored to the test's own
    assert {str(k): (v.lower, v.upper) for k, v in loaded.range_constraints.items()} == {
        str(k): (v.lower, v.upper) for k, v in plain.range_constraints.items()
    }
    other = torch.randn(1, 3, 30, 77)
    torch.testing.assert_close(loaded.module()(x=other), model(other))


def test_loading_a_program_looks_up_each_schema_class_once(tmp_path, monkeypatch):
    """The deserializer asks ``typing.get_type_hints`` of a schema class for every object it decodes;
    under the load patch each (class, namespace) is evaluated once, the serializer's ``typing`` is
    the real module again afterwards, and the loaded program computes as the exported one."""
    import typing

    from torch._export.serde import serialize

    from hf_exporters.exporters.dynamo import load_exported_program

    torch.manual_seed(0)
    model = _PadsToWindowsPerStage().eval()
    inputs = {"x": torch.randn(2, 3, 61, 47)}
    path = DynamoExporter().save(DynamoExporter().export(model, inputs, DynamoConfig(dynamic=False)), tmp_path / "windows")
    asked = []
    real = typing.get_type_hints
    monkeypatch.setattr(typing, "get_type_hints", lambda obj, *a, **k: asked.append(obj) or real(obj, *a, **k))
    with without_workarounds("_patch_schema_type_hints_once"):
        plain = load_exported_program(path)
    plain_asks = len(asked)
    asked.clear()
    loaded = load_exported_program(path)
    assert len(asked) == len(set(asked)) < plain_asks / 10
    assert serialize.typing is typing
    torch.testing.assert_close(loaded.module()(x=inputs["x"]), plain.module()(x=inputs["x"]))
    torch.testing.assert_close(loaded.module()(x=inputs["x"]), model(inputs["x"]))


@pytest.mark.parametrize("model_class", ["FalconMambaModel", "RecurrentGemmaModel", "RwkvModel"])
def test_recurrences_over_the_sequence_keep_the_length_dynamic(tmp_path, model_class):
    """A Python loop over the sequence (Mamba's selective scan, RecurrentGemma's RG-LRU, RWKV's linear
    attention) unrolls under export and fixes the length; as one scan op the length stays dynamic and
    the program matches eager at the export length and at a longer one."""
    program = _length_stays_dynamic(tmp_path, model_class)
    assert any(node.target is torch.ops.higher_order.scan for node in program.graph.nodes)


#: (tiny family, the workarounds it needs, the axis that ends static in a dynamic export without them):
#: the canary tier checks that it still does (test_axis_ends_static_without_the_workaround); the fast
#: tier exports each with them, that axis dynamic.
STATIC_WITHOUT = [
    ("FalconMambaModel", ("_patch_selective_scan_as_scan_op",), StaticAxis("input_ids", 1, 8)),
    ("RecurrentGemmaModel", ("_patch_rglru_scan_as_scan_op",), StaticAxis("input_ids", 1, 8)),
    ("RwkvModel", ("_patch_rwkv_attention_as_scan_op",), StaticAxis("input_ids", 1, 8)),
    ("CpmAntModel", ("_patch_cpmant_mask_positions_from_arange",), StaticAxis("input_ids", 1, 8)),
    ("FunnelModel", ("_patch_funnel_positions_symbolic",), StaticAxis("input_ids", 1, 8)),
    ("ReformerModel", ("_patch_reformer_axial_positions_gathered",), StaticAxis("input_ids", 0, 2)),
    ("PixtralVisionModel", ("_patch_pixtral_same_size_images_batched",), StaticAxis("pixel_values", 0, 2)),
    ("EncodecModel", ("_patch_encodec_single_frame_without_range", "_patch_encodec_decode_trims_without_a_branch"), StaticAxis("input_values", 2, 3200)),
]


@pytest.mark.canary
@pytest.mark.parametrize("model_class, workarounds, axis", STATIC_WITHOUT, ids=[row[0] for row in STATIC_WITHOUT])
def test_axis_ends_static_without_the_workaround(model_class, workarounds, axis):
    """Each family's dynamic export fixes ``axis`` without its workarounds (a Python loop over it, a
    list built over it, a per-sample loop)."""
    model = build(model_class)
    inputs = example_inputs(model)
    with without_workarounds(*workarounds):
        result = DynamoExporter().run(model, inputs, DynamoConfig(dynamic=True))
    assert axis in result.static_axes


def _length_stays_dynamic(tmp_path, model_class):
    """The tiny ``model_class`` exported with a dynamic length (without its workaround the length ends
    static: the canary's STATIC_WITHOUT): no axis ends static and the program matches eager at the
    export length and a longer one. Returns the program."""
    model = build(model_class)
    inputs = example_inputs(model)
    length = inputs["input_ids"].shape[1]
    exporter = DynamoExporter()
    result = exporter.run(model, inputs, DynamoConfig(dynamic=True))
    program = result.program
    assert result.static_axes == []
    other = resized_inputs(program, inputs)
    assert other["input_ids"].shape[1] > length
    reports = check_parity(model, exporter.load_runner(exporter.save(program, tmp_path)), [inputs, other], atol=1e-4)
    assert [r.ok for r in reports] == [True, True]
    assert max(r.max_abs_diff for r in reports) < 1e-5
    return program


def test_recurrence_scans_equal_the_loops():
    """The scan replacements give the loops' numbers, bit for bit, with and without a given state,
    at lengths 2, 3 and 9 (Mamba's selective scan with its bias, softplus, D and gate; the RG-LRU with
    document resets; RWKV with its returned state), and in bfloat16 (a float32 state from bf16 inputs;
    RWKV given a bf16 state, which the loop promotes)."""
    from transformers.models.mamba import modeling_mamba
    from transformers.models.recurrent_gemma import modeling_recurrent_gemma
    from transformers.models.rwkv import modeling_rwkv

    from hf_exporters.registry import apply_patches

    torch.manual_seed(0)
    rglru = modeling_recurrent_gemma.RecurrentGemmaRglru
    originals = (modeling_mamba.mamba_selective_scan, rglru._rnn_scan, modeling_rwkv.rwkv_linear_attention_cpu)
    checked = 0
    for length in (2, 3, 9):
        batch, width, state = 2, 6, 4
        x, dt, z = torch.randn(batch, width, length), torch.randn(batch, width, length), torch.randn(batch, width, length)
        A, B, C = -torch.rand(width, state), torch.randn(batch, state, length), torch.randn(batch, state, length)
        options = {"D": torch.randn(width), "z": z, "delta_bias": torch.randn(width), "delta_softplus": True, "return_last_state": True}
        expected = modeling_mamba.mamba_selective_scan(x, dt, A, B, C, **options)
        gate, reset = torch.rand(batch, length, width), torch.rand(batch, length, 1) < 0.3
        given = torch.randn(batch, width)
        expected_lru = [rglru._rnn_scan(None, x.transpose(1, 2), gate, reset, s) for s in (None, given)]
        time_decay, time_first = torch.randn(width), torch.randn(width)
        key, value = torch.randn(batch, length, width), torch.randn(batch, length, width)
        expected_rwkv = modeling_rwkv.rwkv_linear_attention_cpu(time_decay, time_first, key, value, return_state=True)
        carried = [t.clone() for t in expected_rwkv[1]]
        expected_again = modeling_rwkv.rwkv_linear_attention_cpu(time_decay, time_first, key, value, state=[t.clone() for t in carried])
        with apply_patches("dynamo"):
            patched = (modeling_mamba.mamba_selective_scan, rglru._rnn_scan, modeling_rwkv.rwkv_linear_attention_cpu)
            assert all(p is not o for p, o in zip(patched, originals))
            got = modeling_mamba.mamba_selective_scan(x, dt, A, B, C, **options)
            got_lru = [rglru._rnn_scan(None, x.transpose(1, 2), gate, reset, s) for s in (None, given)]
            got_rwkv = modeling_rwkv.rwkv_linear_attention_cpu(time_decay, time_first, key, value, return_state=True)
            got_again = modeling_rwkv.rwkv_linear_attention_cpu(time_decay, time_first, key, value, state=[t.clone() for t in carried])
            assert modeling_rwkv.rwkv_linear_attention_cpu(time_decay, time_first, key, value)[1] is None
        for want, have in [(expected, got), *zip(expected_lru, got_lru), (expected_rwkv, got_rwkv), (expected_again, got_again)]:
            torch.testing.assert_close(have, want, rtol=0, atol=0)
            checked += 1
    assert checked == 15
    x, dt, z = (t.bfloat16() for t in (x, dt, z))
    B, C = B.bfloat16(), C.bfloat16()
    expected = modeling_mamba.mamba_selective_scan(x, dt, A, B, C, **{**options, "z": z})
    bf16_state = [t.bfloat16() for t in carried]
    expected_rwkv = modeling_rwkv.rwkv_linear_attention_cpu(time_decay, time_first, key.bfloat16(), value.bfloat16(), state=list(bf16_state))
    with apply_patches("dynamo"):
        got = modeling_mamba.mamba_selective_scan(x, dt, A, B, C, **{**options, "z": z})
        got_rwkv = modeling_rwkv.rwkv_linear_attention_cpu(time_decay, time_first, key.bfloat16(), value.bfloat16(), state=list(bf16_state))
    assert [t.dtype for t in got] == [t.dtype for t in expected] and got_rwkv[1][0].dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    torch.testing.assert_close(got_rwkv, expected_rwkv, rtol=0, atol=0)
    assert (modeling_mamba.mamba_selective_scan, rglru._rnn_scan, modeling_rwkv.rwkv_linear_attention_cpu) == originals  # restored


def test_cpmant_mask_keeps_the_length_dynamic(tmp_path):
    """CPM-Ant builds its left-padding positions from a Python list over the length, which fixes it
    under export; from ``arange`` the mask is the same, bit for bit, and the length stays dynamic."""
    from transformers.models.cpmant.modeling_cpmant import CpmAntModel

    from hf_exporters.registry import apply_patches

    model = build("CpmAntModel")
    torch.manual_seed(0)
    for batch, length in ((1, 1), (2, 5), (3, 12)):
        input_ids = torch.zeros(batch, length + model.prompt_length, dtype=torch.long)
        span = torch.randint(0, 2, input_ids.shape).cummax(1).values
        context = (torch.rand(input_ids.shape) < 0.5).int()  # the model passes int32
        lengths = torch.randint(0, length + 1, (batch,), dtype=torch.int32)
        original = CpmAntModel._prepare_attention_mask
        expected = original(model, input_ids, span, context, lengths)
        with apply_patches("dynamo"):
            assert CpmAntModel._prepare_attention_mask is not original
            got = CpmAntModel._prepare_attention_mask(model, input_ids, span, context, lengths)
        assert got.dtype == expected.dtype and got.equal(expected)
    _length_stays_dynamic(tmp_path, "CpmAntModel")


def test_funnel_positions_pool_like_the_lists():
    """:class:`_Positions` answers Funnel's list operations (``[0]``, ``[-1]``, ``[1:]``, ``[1:-1]``,
    ``[::2]``, ``[cls] + ...``, its size) as the Python list would, through every block's pooling for
    lengths 2 to 40, with and without a separate <cls> and truncation; ``relative_pos`` gives the same
    distances from either."""
    from types import SimpleNamespace

    from transformers.models.funnel.modeling_funnel import FunnelAttentionStructure

    from hf_exporters.registry import apply_patches
    from hf_exporters.workarounds.dynamo.positions import _Positions

    def as_list(p):
        return list(p.prefix) + [p.start + i * p.step for i in range(p.count)]

    original_relative_pos = FunnelAttentionStructure.relative_pos
    checked = 0
    with apply_patches("dynamo"):
        for separate_cls in (True, False):
            for truncate_seq in (True, False):
                owner = SimpleNamespace(config=SimpleNamespace(separate_cls=separate_cls, truncate_seq=truncate_seq))
                for length in range(2, 41):
                    listed, kept = list(range(length)), _Positions((), 0, 1, length)
                    for block in range(1, 4):
                        pooled_list = FunnelAttentionStructure.stride_pool_pos(owner, listed, block)
                        pooled = FunnelAttentionStructure.stride_pool_pos(owner, kept, block)
                        if not pooled_list:
                            break
                        assert as_list(pooled) == pooled_list and pooled.size() == len(pooled_list)
                        assert (pooled[0], pooled[-1]) == (pooled_list[0], pooled_list[-1])
                        for args in ((listed, 2 ** (block - 1), pooled_list, 2), (pooled_list, 2**block, None, 1)):
                            want = original_relative_pos(None, *args)
                            as_positions = [kept if a is listed else pooled if a is pooled_list else a for a in args]
                            assert FunnelAttentionStructure.relative_pos(None, *as_positions).equal(want)
                            checked += 1
                        listed, kept = pooled_list, pooled
    assert checked > 600
    assert FunnelAttentionStructure.relative_pos is original_relative_pos


@pytest.mark.canary
def test_funnel_keeps_the_length_dynamic(tmp_path):
    """With its positions kept as numbers, Funnel exports with a dynamic length and matches eager at
    the export length and a longer one. (The fast tier checks the positions against the lists:
    test_funnel_positions_pool_like_the_lists.)"""
    _length_stays_dynamic(tmp_path, "FunnelModel")


class _Recurrent(torch.nn.Module):
    """A batch-first recurrent layer, as an RNN-T prediction network's core (two-layer LSTM) or a GRU."""

    def __init__(self, kind):
        super().__init__()
        self.rnn = torch.nn.LSTM(4, 6, num_layers=2, batch_first=True) if kind == "lstm" else torch.nn.GRU(4, 5, batch_first=True)

    def forward(self, x):
        out, state = self.rnn(x)
        return out, state[0] if isinstance(state, tuple) else state


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_recurrent_layers_keep_the_length_dynamic(tmp_path, kind):
    """torch decomposes LSTM and GRU with a Python loop over time, which fixes the length under export;
    the patch traces a dynamic export with torch's while_loop decompositions instead, and the .pt2 and
    ONNX programs match eager at the export length and at a longer one."""
    torch.manual_seed(0)
    model = _Recurrent(kind).eval()
    inputs = {"x": torch.randn(2, 5, 4)}
    with without_workarounds("_patch_recurrent_layers_as_while_loops"):
        exporter = DynamoExporter()
        result = exporter.run(model, inputs, DynamoConfig(dynamic=True))
        assert StaticAxis("x", 1, 5) in result.static_axes
    exporter = DynamoExporter()
    result = exporter.run(model, inputs, DynamoConfig(dynamic=True))
    program = result.program
    assert result.static_axes == [StaticAxis("x", 2, 4)]  # the features meet the weights
    longer = {"x": torch.randn(3, 11, 4)}
    reports = check_parity(model, exporter.load_runner(exporter.save(program, tmp_path)), [inputs, longer], atol=1e-5)
    assert [r.ok for r in reports] == [True, True]
    assert torch.export.export.__module__ == "torch.export"  # restored
    pytest.importorskip("onnxruntime", reason="the ONNX half needs the onnx extra")
    from hf_exporters import OnnxConfig
    from hf_exporters.exporters.onnx import OnnxExporter

    onnx = OnnxExporter()
    runner = onnx.load_runner(onnx.save(onnx.export(model, inputs, OnnxConfig(dynamic=True)), tmp_path / "onnx"))
    reports = check_parity(model, runner, [inputs, longer], atol=1e-5)
    assert [r.ok for r in reports] == [True, True]


def test_reformer_axial_positions_keep_the_batch_dynamic(tmp_path):
    """Reformer selects each sample's axial positions in a loop over the batch, which fixes the batch
    size (the canary's STATIC_WITHOUT); gathered from the full axial grid, the batch stays dynamic, and the program matches eager
    at the export batch and at a larger one (other lengths too), with position ids that skip around."""
    model = build("ReformerModel")
    inputs = example_inputs(model)
    exporter = DynamoExporter()
    result = exporter.run(model, inputs, DynamoConfig(dynamic=True))
    program = result.program
    assert result.static_axes == []
    other = resized_inputs(program, inputs)
    assert other["input_ids"].shape[0] > 2
    reports = check_parity(model, exporter.load_runner(exporter.save(program, tmp_path)), [inputs, other], atol=1e-5)
    assert [r.ok for r in reports] == [True, True]
    from hf_exporters.registry import apply_patches

    embeddings = model.embeddings.position_embeddings
    positions = torch.tensor([[0, 5, 3, 7], [6, 1, 1, 2]])  # not in order, repeated
    with torch.no_grad():
        want = embeddings(positions)
        with apply_patches("dynamo"):
            got = embeddings(positions)
    assert torch.equal(got, want)


def test_pixtral_same_size_images_keep_the_batch_dynamic(tmp_path):
    """Pixtral without ``image_sizes`` walks the images in Python lists, fixing the batch (the canary's
    STATIC_WITHOUT); the patch of
    the model's own forward (which takes effect although the exporter wraps ``forward`` first) packs
    them at once, the batch stays dynamic and the program matches eager at 2 and at 4 images. The
    patched method keeps the class's decorators: hidden states can still be asked for."""
    model = build("PixtralVisionModel")
    inputs = example_inputs(model)
    exporter = DynamoExporter()
    result = exporter.run(model, inputs, DynamoConfig(dynamic=True))
    program = result.program
    assert StaticAxis("pixel_values", 0, 2) not in result.static_axes
    four = {"pixel_values": torch.randn(4, *inputs["pixel_values"].shape[1:])}
    reports = check_parity(model, exporter.load_runner(exporter.save(program, tmp_path)), [inputs, four], atol=1e-5)
    assert [r.ok for r in reports] == [True, True]
    from hf_exporters.registry import apply_patches

    with torch.no_grad():
        want = model(**four, output_hidden_states=True)
        with apply_patches("dynamo"):
            got = model(**four, output_hidden_states=True)
    assert len(got.hidden_states) == len(want.hidden_states) == model.config.num_hidden_layers + 1
    torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, rtol=0, atol=1e-6)


def test_encodec_keeps_the_waveform_length_dynamic(tmp_path):
    """Encodec without chunking loops ``range(0, length, length)`` (one frame; the range fixes the
    length) and cuts the decoder's output to the input length behind a length comparison (not taken at
    a length that is a multiple of the hop): the length ends static (the canary's STATIC_WITHOUT). Under the two patches the length stays dynamic and the
    program matches eager, shape and samples, at the export length and at a length that is not a
    multiple of the hop."""
    model = build("EncodecModel")
    torch.manual_seed(0)
    inputs = {"input_values": torch.randn(2, 1, 3200)}
    # no unpatched trace of Encodec before this one in the process (the canary tier's are): it leaves a
    # length guard (10 frames) in the next program's input guards (a leak through torch's trace state)
    exporter = DynamoExporter()
    result = exporter.run(model, inputs, DynamoConfig(dynamic=True))
    program = result.program
    # the length stays dynamic; the channel axis is the model's audio_channels (mono), pinned by a guard
    assert result.static_axes == [StaticAxis("input_values", 1, 1)]
    assert result.static_axes[0].guard == "input_values.size()[1] == 1"
    program.module()(input_values=torch.randn(3, 1, 3203))  # the in-memory program's guards accept another length
    odd = {"input_values": torch.randn(3, 1, 3203)}
    runner = exporter.load_runner(exporter.save(program, tmp_path))
    reports = check_parity(model, runner, [inputs, odd], atol=1e-5)
    assert [r.ok for r in reports] == [True, True]
    with torch.no_grad():
        codes, values = runner(odd)[:2]  # EncodecOutput: audio_codes, audio_values
        assert values.shape[-1] == model(**odd).audio_values.shape[-1] == 3203


def _with_no_global_token(model_class):
    model = build(model_class)
    inputs = example_inputs(model)
    batch, length = inputs["input_ids"].shape
    inputs["global_attention_mask"] = torch.zeros(batch, length, dtype=torch.long)
    return model, inputs


@pytest.mark.canary
@pytest.mark.parametrize("model_class", ["LongformerModel", "LEDModel"])
def test_longformer_attention_is_refused_without_the_dense_patch(model_class):
    """Without the dense-attention patch the trace stops on Longformer's "any global token" guard."""
    model, inputs = _with_no_global_token(model_class)
    with without_workarounds("_patch_longformer_attention_dense"):
        with pytest.raises(ExportStageError) as failed:
            DynamoExporter().export(model, inputs, DynamoConfig(dynamic=True))
        assert failed.value.stage == "trace (torch.export.export)"
        assert "GuardOnDataDependentSymNode" in str(failed.value)


@pytest.mark.parametrize("model_class", ["LongformerModel", pytest.param("LEDModel", marks=pytest.mark.canary)])
def test_longformer_attention_exports_with_global_tokens(tmp_path, model_class):
    """Longformer's attention branches on ``.item()`` of "any global token" and sizes tensors by the
    global count; LED's encoder copies it (the same patch: the canary tier runs it). With the
    dense-attention patch one dynamic program matches eager with no global token, with global tokens
    and padding, and at a longer length."""
    model, inputs = _with_no_global_token(model_class)
    length = inputs["input_ids"].shape[1]
    exporter = DynamoExporter()
    result = exporter.run(model, inputs, DynamoConfig(dynamic=True))
    program = result.program
    assert result.static_axes == []
    with_global = {k: v.clone() for k, v in inputs.items()}
    with_global["global_attention_mask"][:, 0] = 1
    with_global["global_attention_mask"][1, 3] = 1
    with_global["attention_mask"][0, -2:] = 0
    longer = resized_inputs(program, with_global)
    assert longer["input_ids"].shape[1] > length
    runner = exporter.load_runner(exporter.save(program, tmp_path))
    reports = check_parity(model, runner, [inputs, with_global, longer], atol=1e-4)
    assert [r.ok for r in reports] == [True, True, True]
    assert max(r.max_abs_diff for r in reports) < 1e-5
    # the global tokens change the output: the second set really takes the global path
    local_only = dict(with_global, global_attention_mask=inputs["global_attention_mask"])
    changed = max((a - b).abs().max().item() for a, b in zip(runner(with_global), runner(local_only)))
    assert changed > 1e-2


def test_distribution_in_forward_exports_and_validation_is_restored(tmp_path):
    """A forward that builds a ``torch.distributions`` object (BLT's entropy patcher) stops the trace
    on the constructor's argument check; with validation off during the export it matches eager,
    and the class default is back afterwards."""
    from torch.distributions import Categorical, Distribution

    class Entropy(torch.nn.Module):
        def forward(self, logits):
            return Categorical(logits=logits).entropy()

    logits = torch.randn(2, 5, 7)
    default = Distribution._validate_args
    with without_workarounds("_patch_distributions_skip_argument_validation"):
        with pytest.raises(ExportStageError) as failed:
            DynamoExporter().export(Entropy(), {"logits": logits}, DynamoConfig(dynamic=False))
        assert "GuardOnDataDependentSymNode" in str(failed.value)
    exporter = DynamoExporter()
    program = exporter.export(Entropy(), {"logits": logits}, DynamoConfig(dynamic=True))
    assert Distribution._validate_args is default
    runner = exporter.load_runner(exporter.save(program, tmp_path))
    longer = {"logits": torch.randn(3, 9, 7)}
    reports = check_parity(Entropy(), runner, [{"logits": logits}, longer], atol=1e-5)
    assert [r.ok for r in reports] == [True, True]
    assert runner(longer)[0].shape == (3, 9)


def test_fastspeech2_length_regulator_gathered_equals_the_model_s():
    """The patched length regulator equals FastSpeech 2's own, the all-zero-durations rule included
    (the model's export with it: test_fastspeech2_length_regulator_gives_a_data_dependent_frame_count)."""
    import transformers.models.fastspeech2_conformer.modeling_fastspeech2_conformer as fs2

    from hf_exporters.workarounds.dynamo.audio import _patch_fastspeech2_length_regulator_gathered

    regulator = _patch_fastspeech2_length_regulator_gathered(fs2.length_regulator)
    torch.manual_seed(0)
    embeddings = torch.randn(3, 5, 4)
    for durations in (torch.tensor([[1, 0, 2, 3, 0], [0, 0, 0, 0, 0], [4, 1, 1, 0, 2]]), torch.zeros(3, 5, dtype=torch.long)):
        expected = fs2.length_regulator(embeddings, durations.clone())
        got = regulator(embeddings, durations.clone())
        assert got.shape == expected.shape and torch.equal(got, expected)


@pytest.mark.canary
def test_fastspeech2_length_regulator_gives_a_data_dependent_frame_count(tmp_path):
    """FastSpeech 2 expands each phoneme by its predicted duration: a branch on the durations' sum and a
    per-sample ``repeat_interleave`` loop, then a relative-position decoder over the frames. Without
    the three patches the trace stops on a data-dependent guard (the canary's REFUSED_WITHOUT); with
    them one dynamic program matches eager on two input sets whose spectrograms differ in length."""
    model = build("FastSpeech2ConformerModel")
    inputs = example_inputs(model)
    exporter = DynamoExporter()
    program = exporter.export(model, inputs, DynamoConfig(dynamic=True))
    batch, length = inputs["input_ids"].shape
    other = {**inputs, "input_ids": torch.randint(1, model.config.vocab_size, (batch + 1, length + 3))}
    other = {k: (torch.ones_like(other["input_ids"]) if k == "attention_mask" else v) for k, v in other.items()}
    runner = exporter.load_runner(exporter.save(program, tmp_path))
    reports = check_parity(model, runner, [inputs, other], atol=1e-4)
    assert [r.ok for r in reports] == [True, True]
    with torch.no_grad():
        frames = [model(**s).spectrogram.shape[1] for s in (inputs, other)]
    assert frames[0] != frames[1]


def test_kimi_vision_indices_keep_the_grid_symbolic(tmp_path):
    """Kimi-K2.5's vision tower reads the grid with ``int()`` in its frame index and its temporal
    pooling index, which stops even a static trace. The patched helpers equal the model's own on
    images and multi-frame clips; with them one dynamic program matches eager on two images of different sizes and on
    three two-frame clips of other sizes."""
    import transformers.models.kimi_k25.modeling_kimi_k25 as kimi

    from hf_exporters.workarounds.dynamo.vision import _patch_kimi_frame_index_symbolic, _patch_kimi_temporal_merge_index_symbolic

    frame_index = _patch_kimi_frame_index_symbolic(kimi.get_vision_frame_index)
    merge_index = _patch_kimi_temporal_merge_index_symbolic(kimi.get_vision_temporal_merge_index)
    for grid in ([[1, 4, 6], [1, 2, 2]], [[3, 4, 2], [3, 2, 4]], [[2, 6, 4]]):
        grid = torch.tensor(grid)
        assert torch.equal(frame_index(grid), kimi.get_vision_frame_index(grid))
        got, want = merge_index(grid, 2, 2), kimi.get_vision_temporal_merge_index(grid, 2, 2)
        assert got.shape == want.shape and torch.equal(got, want)

    model = build("Kimi_K25VisionModel")
    inputs = example_inputs(model)
    patch = inputs["pixel_values"].shape[1:]
    images = {"pixel_values": torch.randn(16 + 8, *patch), "grid_thw": torch.tensor([[1, 4, 4], [1, 2, 4]])}
    exporter = DynamoExporter()
    program = exporter.export(model, images, DynamoConfig(dynamic=True))
    clips = {"pixel_values": torch.randn(2 * 2 * 4 * 2 + 2 * 4 * 6, *patch), "grid_thw": torch.tensor([[2, 2, 4], [2, 4, 6], [2, 4, 2]])}
    reports = check_parity(model, exporter.load_runner(exporter.save(program, tmp_path)), [images, clips], atol=1e-4)
    assert [r.ok for r in reports] == [True, True]


def test_vision_position_ids_and_videollama3_downsampling_for_any_image_count(tmp_path):
    """transformers' vision position-id helper loops over the images (the image count ends static) and
    VideoLLaMA3 downsamples each image with views and ``interpolate`` on its grid (even a static trace
    stops). The patched helpers equal the originals on images, clips and per-image merge sizes; with
    them one VideoLLaMA3 vision program matches eager on one image and on three of other sizes."""
    import transformers.models.video_llama_3.modeling_video_llama_3 as vl3
    import transformers.vision_utils as vision_utils

    from hf_exporters.workarounds.dynamo.vision import _patch_videollama3_pixel_unshuffle_gathered, _patch_vision_position_ids_symbolic

    position_ids = _patch_vision_position_ids_symbolic(vision_utils.get_vision_position_ids)
    unshuffle = _patch_videollama3_pixel_unshuffle_gathered(vl3.VideoLlama3VisionModel.pixel_unshuffle)
    torch.manual_seed(0)
    for grid, merge in (([[1, 4, 6], [1, 2, 2]], 2), ([[3, 4, 2], [2, 2, 4]], 1), ([[2, 6, 4], [1, 4, 4]], [2, 1]), ([[2, 4, 8], [1, 6, 3]], [4, 3])):
        grid = torch.tensor(grid)
        merge = merge if isinstance(merge, int) else torch.tensor(merge)
        for temporal in (False, True):
            got, want = position_ids(grid, merge, include_temporal=temporal), vision_utils.get_vision_position_ids(grid, merge, include_temporal=temporal)
            assert got.shape == want.shape and torch.equal(got, want)
        if not isinstance(merge, int):
            hidden = torch.randn(int(grid.prod(dim=1).sum()), 5)
            got, want = unshuffle(None, hidden, grid, merge), vl3.VideoLlama3VisionModel.pixel_unshuffle(None, hidden, grid, merge)
            assert got.shape == want.shape and torch.equal(got, want)

    model = build("VideoLlama3VisionModel")
    inputs = example_inputs(model)
    exporter = DynamoExporter()
    result = exporter.run(model, inputs, DynamoConfig(dynamic=True))
    program = result.program
    width = inputs["pixel_values"].shape[1]
    # the patch count stays dynamic; the patch width (channels x patch area) is the embedding's, pinned by its reshape
    assert result.static_axes == [StaticAxis("pixel_values", 1, width)]
    three = {"pixel_values": torch.randn(4 + 8 + 4, width), "grid_thw": torch.tensor([[1, 2, 2], [2, 2, 2], [1, 2, 2]]), "merge_sizes": torch.tensor([1, 1, 1])}
    reports = check_parity(model, exporter.load_runner(exporter.save(program, tmp_path)), [inputs, three], atol=1e-4)
    assert [r.ok for r in reports] == [True, True]


def test_export_traces_in_eval_mode_and_gives_the_training_flags_back():
    """The trace runs in eval mode (dropout off); afterwards every submodule's ``training`` flag is the caller's,
    mixed ones included."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5), torch.nn.Sequential(torch.nn.Dropout(0.5)))
    model.train()
    model[2].eval()
    x = torch.randn(3, 4)
    ep = DynamoExporter().export(model, {"input": x})
    assert [m.training for m in model.modules()] == [True, True, True, False, False]
    with torch.no_grad():
        expected = model[0](x)  # dropout off
    assert torch.equal(ep.module()(input=x), expected)
