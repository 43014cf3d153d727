"""VAR transformer: the official var_d{16,20,24,30}.pth layout, config inference (heads from the file
name or an argument), the KV cache against the teacher-forced pass, clear errors."""

import pytest
import torch

from mmaccel.errors import InputError
from mmaccel.image.models.var import VAR, VARConfig, infer_var_config, load_var, save_var, var_config

PN = (1, 2, 3, 4)


def tiny_var(seed: int = 0, **overrides) -> VAR:
    torch.manual_seed(seed)
    config = VARConfig(**{"vocab_size": 32, "z_channels": 8, "num_classes": 5, "depth": 2, "embed_dim": 32,
                          "num_heads": 4, "patch_nums": PN, **overrides})
    model = VAR(config)
    model.init_weights()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.eval()


@pytest.mark.parametrize("depth", [16, 20, 24, 30])
def test_official_sizes_and_layout_on_meta_device(depth):
    with torch.device("meta"):
        state = VAR(var_config(depth)).state_dict()
    C = 64 * depth
    assert tuple(state["pos_1LC"].shape) == (1, 680, C)
    assert tuple(state["attn_bias_for_masking"].shape) == (1, 1, 680, 680)
    assert tuple(state["lvl_1L"].shape) == (1, 680)
    assert tuple(state["class_emb.weight"].shape) == (1001, C)
    assert tuple(state[f"blocks.{depth - 1}.attn.scale_mul_1H11"].shape) == (1, depth, 1, 1)
    assert tuple(state["blocks.0.attn.mat_qkv.weight"].shape) == (3 * C, C)
    assert tuple(state["blocks.0.attn.zero_k_bias"].shape) == (C,)
    assert tuple(state["blocks.0.ada_lin.1.weight"].shape) == (6 * C, C)
    assert tuple(state["head_nm.ada_lin.1.weight"].shape) == (2 * C, C)
    assert tuple(state["head.weight"].shape) == (4096, C)
    assert "blocks.0.attn.mat_qkv.bias" not in state and "shared_ada_lin.1.weight" not in state


def test_inference_reads_the_official_d16_shapes():
    with torch.device("meta"):
        state = VAR(var_config(16)).state_dict()
    levels = [torch.full((p * p,), i) for i, p in enumerate((1, 2, 3, 4, 5, 6, 8, 10, 13, 16))]
    state["lvl_1L"] = torch.cat(levels)[None]          # the only tensor whose values are read
    config = infer_var_config(state, name="var_d16.pth")
    assert (config.depth, config.embed_dim, config.num_heads, config.num_classes) == (16, 1024, 16, 1000)
    assert config.patch_nums == (1, 2, 3, 4, 5, 6, 8, 10, 13, 16) and config.attn_l2_norm


@pytest.mark.parametrize("overrides", [{}, {"shared_aln": True}, {"attn_l2_norm": False}])
def test_raw_state_dict_round_trips(tmp_path, overrides):
    model = tiny_var(**overrides)
    path = tmp_path / "var_d2.pth"
    torch.save(model.state_dict(), path)
    loaded = load_var(path, num_heads=None if model.config.attn_l2_norm else 4)
    assert loaded.config == model.config
    labels, inputs = torch.tensor([1, 5]), torch.randn(2, 29, 8)
    with torch.no_grad():
        assert torch.equal(model(labels, inputs), loaded(labels, inputs))


def test_heads_come_from_the_file_name_when_the_tensors_cannot_tell(tmp_path):
    model = tiny_var(attn_l2_norm=False, num_heads=2)
    state = model.state_dict()
    named = tmp_path / "var_d2.pth"               # official naming: heads = depth
    torch.save(state, named)
    assert load_var(named).config.num_heads == 2
    anonymous = tmp_path / "model.pth"
    torch.save(state, anonymous)
    with pytest.raises(InputError, match="num_heads="):
        load_var(anonymous)
    assert load_var(anonymous, num_heads=2).config.num_heads == 2
    wrong = tmp_path / "var_d16.pth"
    torch.save(state, wrong)
    with pytest.raises(InputError, match="depth 16"):
        load_var(wrong, num_heads=2)


def test_safetensors_fp16_save_loads_back(tmp_path):
    model = tiny_var()
    loaded = load_var(save_var(model, tmp_path / "v.safetensors", dtype=torch.float16))
    assert loaded.config == model.config
    assert torch.equal(loaded.head.weight, model.head.weight.half().float())


def test_wrong_layout_names_the_keys():
    state = tiny_var().state_dict()
    state["blocks.0.attn.qkv.weight"] = state.pop("blocks.0.attn.mat_qkv.weight")
    with pytest.raises(InputError, match="mat_qkv"):
        load_var(state, tiny_var().config)
    with pytest.raises(InputError, match="cannot infer"):
        load_var({"head.weight": torch.zeros(4, 4)})


def test_cached_scale_by_scale_logits_equal_the_teacher_forced_pass():
    model = tiny_var().double()
    labels, inputs = torch.tensor([0, 3]), torch.randn(2, 29, 8, dtype=torch.float64)
    with torch.no_grad():
        full = model(labels, inputs)
        cond = model.class_emb(labels)
        cache = model.new_cache(2, len(PN))
        for k in range(len(PN)):
            lo, hi = model.offsets[k], model.offsets[k + 1]
            block_inputs = None if k == 0 else inputs[:, lo - 1:hi - 1]
            x = model.embed_blocks(cond, block_inputs, k, k + 1)
            torch.testing.assert_close(model.forward_blocks(x, cond, cache, k, k + 1), full[:, lo:hi])
        # one block-causal prefill of blocks 0..2, as CoDe's refiner runs it
        cache = model.new_cache(2, len(PN))
        x = model.embed_blocks(cond, inputs[:, :13], 0, 3)
        torch.testing.assert_close(model.forward_blocks(x, cond, cache, 0, 3), full[:, 5:14])
        assert cache.length == 14


def test_cache_misuse_is_refused():
    model = tiny_var()
    cond = model.class_emb(torch.tensor([0]))
    cache = model.new_cache(1, 2)
    with pytest.raises(InputError, match="starts at"):
        model.forward_blocks(model.embed_blocks(cond, torch.randn(1, 4, 8), 1, 2), cond, cache, 1, 2)
    with pytest.raises(InputError, match="at most"):
        model.forward_blocks(model.embed_blocks(cond, torch.randn(1, 13, 8), 0, 3), cond, cache, 0, 3)


@pytest.mark.parametrize("bad", [{"embed_dim": 30, "num_heads": 4}, {"patch_nums": (2, 1)}, {"depth": 0}])
def test_bad_configs(bad):
    with pytest.raises(InputError):
        tiny_var(**bad)
