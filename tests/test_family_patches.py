"""The model-family patches, each on the tiny model of its family: with the patches of its backend
installed, the model's own forward calls the replacement (recorded as fired) and gives eager's
numbers, element by element.

This is the smallest test of each family patch that needs no export. That the patch is needed is the
canary tier's (tests/test_dynamo_exporter.py REFUSED_WITHOUT, STATIC_WITHOUT; the ExecuTorch cases);
that the exported program matches eager is the fast tier's parity test of the same family.
"""

from __future__ import annotations

import pytest
import torch

from hf_exporters import registry
from config_models import build, example_inputs

#: (model class of tests/configs, backend whose patches are installed, workarounds that must fire)
FAMILY_PATCHES = [
    # mixture-of-experts blocks that loop over the experts hit by the routing (nonzero of the mask)
    ("OpenAIPrivacyFilterModel", "dynamo", ("_patch_eager_experts_as_batched_mm",)),
    ("SwitchTransformersModel", "dynamo", ("_patch_switch_experts_dense",)),
    ("DbrxModel", "dynamo", ("_patch_dbrx_experts_dense",)),
    ("Step3p7Model", "dynamo", ("_patch_step3p7_experts_dense",)),
    ("LongcatFlashModel", "dynamo", ("_patch_longcat_flash_experts_dense",)),
    # masks and merges that branch on the data
    ("FSMTModel", "dynamo", ("_patch_fsmt_padding_mask_always",)),
    ("UdopModel", "dynamo", ("_patch_udop_combine_without_ragged_rows",)),
    ("CpmAntModel", "dynamo", ("_patch_cpmant_mask_positions_from_arange",)),
    # vision towers reading each image's grid as Python ints
    ("Qwen2_5_VisionTransformerPretrainedModel", "dynamo", ("_patch_vision_window_index_by_sort", "_patch_varlen_attention_as_block_mask")),
    ("MiniCPMOcrVisionModel", "dynamo", ("_patch_vision_nearest_position_ids_symbolic",)),
    ("MuseSparkVisionModel", "dynamo", ("_patch_vision_pixel_shuffle_index_symbolic",)),
    ("Cosmos3EdgeVisionModel", "dynamo", ("_patch_cosmos3_edge_grid_sides_checked",)),
    ("PixtralVisionModel", "dynamo", ("_patch_pixtral_same_size_images_batched",)),
    # positions and audio geometry built in Python
    ("ReformerModel", "dynamo", ("_patch_reformer_axial_positions_gathered",)),
    ("FastSpeech2ConformerModel", "dynamo",
     ("_patch_fastspeech2_length_regulator_gathered", "_patch_fastspeech2_relative_table_bounded", "_patch_relative_shift_gathered")),
    ("EncodecModel", "dynamo",
     ("_patch_encodec_conv_padding_from_ints", "_patch_encodec_single_frame_without_range", "_patch_encodec_decode_trims_without_a_branch")),
    ("MimiModel", "dynamo", ("_patch_streaming_conv_padding_from_ints",)),
    ("LongformerModel", "dynamo", ("_patch_longformer_attention_dense",)),
    # recurrences over the sequence as one scan op
    ("FalconMambaModel", "dynamo", ("_patch_selective_scan_as_scan_op",)),
    ("RecurrentGemmaModel", "dynamo", ("_patch_rglru_scan_as_scan_op",)),
    ("RwkvModel", "dynamo", ("_patch_rwkv_attention_as_scan_op",)),
    # complex numbers ExecuTorch has no kernels for, as real pairs
    ("DeepseekV2Model", "executorch", ("_patch_deepseek_v2_rotary_as_real_pairs", "_patch_deepseek_v2_apply_rotary_real")),
    ("Llama4TextModel", "executorch", ("_patch_deepseek_v2_rotary_as_real_pairs", "_patch_llama4_apply_rotary_real")),
    ("FNetModel", "executorch", ("_patch_fnet_fourier_as_real_matmuls",)),
]


def _floats(output) -> list[torch.Tensor]:
    """The floating tensors of a model output, in order."""
    leaves = torch.utils._pytree.tree_leaves(output.to_tuple() if hasattr(output, "to_tuple") else output)
    return [leaf for leaf in leaves if isinstance(leaf, torch.Tensor) and leaf.is_floating_point()]


@pytest.mark.parametrize("model_class, backend, names", FAMILY_PATCHES, ids=[row[0] for row in FAMILY_PATCHES])
def test_family_patch_fires_and_keeps_eager_numbers(model_class, backend, names):
    model = build(model_class)
    inputs = example_inputs(model)
    with torch.no_grad():
        expected = _floats(model(**inputs))
        with registry.recording_fired() as fired, registry.apply_patches(backend):
            got = _floats(model(**inputs))
    assert set(names) <= {w.name for w in fired}, f"not fired: {sorted(set(names) - {w.name for w in fired})}"
    assert len(got) == len(expected) > 0
    assert max(e.abs().max().item() for e in expected) > 1e-2  # the outputs carry signal
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)
