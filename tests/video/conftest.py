"""Tiny random Qwen-VL models (no download): the same classes a user's checkpoint loads into."""

import pytest
import torch

VOCAB, VS, VE, VIDEO, IMAGE = 96, 90, 91, 92, 93


def tiny_qwen_vl(kind: str = "qwen2_5_vl", seed: int = 0, num_layers: int = 2):
    """A 2-layer (`num_layers`) Qwen2.5-VL (or Qwen2-VL) with a 2-block vision tower: 28-pixel merged tokens,
    frames in pairs."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2VLConfig, Qwen2VLForConditionalGeneration

    text = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=num_layers, num_attention_heads=4,
                num_key_value_heads=2, intermediate_size=128, max_position_embeddings=4096,
                rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0})
    ids = dict(image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=VS, vision_end_token_id=VE)
    torch.manual_seed(seed)
    if kind == "qwen2_5_vl":
        vision = dict(depth=2, hidden_size=32, out_hidden_size=64, intermediate_size=64, num_heads=2, patch_size=14,
                      spatial_merge_size=2, temporal_patch_size=2, window_size=56, fullatt_block_indexes=[1])
        model = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(text_config=text, vision_config=vision, **ids))
    else:
        vision = dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, patch_size=14, spatial_merge_size=2,
                      temporal_patch_size=2, mlp_ratio=2)
        model = Qwen2VLForConditionalGeneration(Qwen2VLConfig(text_config=text, vision_config=vision, **ids))
    return model.eval()


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen2_vl"])
def qwen_vl(request):
    return tiny_qwen_vl(request.param)
