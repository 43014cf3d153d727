"""Multi-scale VQ-VAE: the official VAR layout (vae_ch160v4096z32.pth), strict loading, the residual
pyramid's identities, clear errors."""

import pytest
import torch

from mmaccel.errors import InputError, ModelNotFoundError
from mmaccel.image.tokenizers.msvq import (
    VAR_PATCH_NUMS,
    MSVQConfig,
    MSVQModel,
    check_patch_nums,
    infer_msvq_config,
    load_msvq,
    save_msvq,
)

PN = (1, 2, 3, 4)
TINY = MSVQConfig(vocab_size=32, z_channels=8, ch=16, ch_mult=(1, 2, 2), num_res_blocks=1, using_sa=True,
                  patch_nums=PN, norm_groups=16)   # the groups inference picks: gcd(32, widths)


def tiny_model(config: MSVQConfig = TINY, seed: int = 0) -> MSVQModel:
    torch.manual_seed(seed)
    model = MSVQModel(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


@pytest.fixture(scope="module")
def images() -> torch.Tensor:
    return torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(1)) * 2 - 1


def test_official_vae_layout_on_meta_device():
    with torch.device("meta"):
        state = MSVQModel(MSVQConfig()).state_dict()
    shapes = {k: tuple(v.shape) for k, v in state.items()}
    assert shapes["quantize.embedding.weight"] == (4096, 32)
    assert shapes["quantize.ema_vocab_hit_SV"] == (10, 4096)
    assert shapes["encoder.conv_in.weight"] == (160, 3, 3, 3)
    assert shapes["encoder.down.4.attn.1.qkv.weight"] == (1920, 640, 1, 1)
    assert shapes["decoder.up.4.attn.2.proj_out.weight"] == (640, 640, 1, 1)
    assert shapes["encoder.down.1.downsample.conv.weight"] == (160, 160, 3, 3)
    assert shapes["decoder.up.1.upsample.conv.weight"] == (160, 160, 3, 3)
    assert shapes["encoder.down.2.block.0.nin_shortcut.weight"] == (320, 160, 1, 1)
    assert sorted(k for k in state if k.startswith("quantize.quant_resi")) == [
        f"quantize.quant_resi.qresi_ls.{i}.{p}" for i in range(4) for p in ("bias", "weight")]
    assert "encoder.down.3.attn.0.qkv.weight" not in state       # attention only at the lowest resolution
    assert MSVQModel(MSVQConfig(ch=16, norm_groups=8)).config.downsample == 16


@pytest.mark.parametrize("share", [0, 1, 4])
def test_raw_state_dict_round_trips_with_inferred_config(tmp_path, images, share):
    config = MSVQConfig(**{**TINY.__dict__, "share_quant_resi": share})
    model = tiny_model(config)
    path = tmp_path / "vae_ch16v32z8.pth"
    torch.save(model.state_dict(), path)                  # the official file is a raw state dict
    loaded = load_msvq(path, patch_nums=PN)
    assert loaded.config.share_quant_resi == share and loaded.config.ch_mult == (1, 2, 2)
    codes = model.encode(images)
    assert all(torch.equal(a, b) for a, b in zip(codes, loaded.encode(images)))
    assert torch.equal(model.decode(codes), loaded.decode(codes))


def test_safetensors_round_trip_keeps_config(tmp_path, images):
    model = tiny_model()
    path = save_msvq(model, tmp_path / "msvq.safetensors")
    loaded = load_msvq(path)
    assert loaded.config == model.config
    assert all(torch.equal(a, b) for a, b in zip(model.encode(images), loaded.encode(images)))


def test_pyramid_shapes_and_residual_identities(images):
    model = tiny_model()
    codes = model.encode(images)
    assert [c.shape for c in codes] == [(2, p * p) for p in PN]
    q = model.quantize
    # teacher-forcing inputs equal the inputs the generation loop builds scale by scale
    inputs = q.scale_inputs(codes)
    assert inputs.shape == (2, sum(p * p for p in PN[1:]), 8)
    f_hat, built = torch.zeros(2, 8, 4, 4), []
    with torch.no_grad():
        for si, (p, c) in enumerate(zip(PN, codes)):
            f_hat, nxt = q.next_input(si, f_hat, q.embedding(c).transpose(1, 2).reshape(2, 8, p, p))
            if nxt is not None:
                built.append(nxt)
        assert torch.allclose(torch.cat(built, 1), inputs, atol=1e-6)
        assert torch.allclose(f_hat, q.f_hat(codes), atol=1e-6)


def test_training_forward_gives_gradients_to_codebook_phi_and_encoder(images):
    model = tiny_model().train()
    recon, loss, idx = model.training_forward(images)
    (recon.pow(2).mean() + loss).backward()
    for name in ("quantize.embedding.weight", "quantize.quant_resi.qresi_ls.0.weight", "encoder.conv_in.weight",
                 "decoder.conv_out.weight"):
        grad = dict(model.named_parameters())[name].grad
        assert grad is not None and grad.abs().sum() > 0, name


# bad input ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("nums", [(1, 3, 2), (2, 2, 4), (4,), (0, 2), ("a", 2)])
def test_bad_schedules_are_refused(nums):
    with pytest.raises(InputError):
        check_patch_nums(nums)


def test_last_scale_must_match_the_latent_grid():
    model = tiny_model()
    with pytest.raises(InputError, match="16x16"):
        model.encode(torch.zeros(1, 3, 32, 32))
    with pytest.raises(InputError, match="last scale"):
        model.quantize.quantize(torch.zeros(1, 8, 5, 5))


def test_wrong_layout_names_the_keys(tmp_path):
    state = tiny_model().state_dict()
    state["quantize.codebook.weight"] = state.pop("quantize.embedding.weight")
    with pytest.raises(InputError, match="quantize.embedding.weight"):
        load_msvq(state, TINY)
    with pytest.raises(InputError, match="cannot infer"):
        infer_msvq_config({"encoder.conv_in.weight": torch.zeros(16, 3, 3, 3)})


def test_schedule_length_must_match_the_usage_buffer():
    state = tiny_model().state_dict()
    with pytest.raises(InputError, match="4 scales"):
        load_msvq(state)            # default schedule has 10 scales, the buffer 4
    assert load_msvq(state, patch_nums=(1, 2, 3, 4)).patch_nums == PN
    assert VAR_PATCH_NUMS[-1] == 16


def test_missing_and_corrupt_files(tmp_path):
    with pytest.raises(ModelNotFoundError):
        load_msvq(tmp_path / "vae_ch160v4096z32.pth")
    bad = tmp_path / "bad.pth"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(InputError):
        load_msvq(bad)


def test_decode_checks_its_indices():
    model = tiny_model()
    with pytest.raises(InputError, match="4 scales"):
        model.decode([torch.zeros(1, 1, dtype=torch.long)])
    with pytest.raises(InputError, match=r"\[0, 32\)"):
        model.decode([torch.full((1, p * p), 40) for p in PN])
