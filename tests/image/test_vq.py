"""VQ tokenizer: official LlamaGen VQ-16 layout, strict loading, exact quantisation, clear errors."""

import pytest
import torch

from mmaccel.errors import InputError, ModelNotFoundError
from mmaccel.image.tokenizers.vq import VQConfig, VQModel, infer_vq_config, load_vq, save_vq

TINY = VQConfig(codebook_size=64, codebook_embed_dim=8, ch=16, ch_mult=(1, 2), num_res_blocks=1, z_channels=16,
                norm_groups=8)


@pytest.fixture(scope="module")
def tiny() -> VQModel:
    torch.manual_seed(0)
    return VQModel(TINY).eval()


@pytest.fixture(scope="module")
def images() -> torch.Tensor:
    return torch.rand(2, 3, 8, 12, generator=torch.Generator().manual_seed(1)) * 2 - 1


def assert_same_model(a: VQModel, b: VQModel, images: torch.Tensor) -> None:
    codes = a.encode(images)
    assert torch.equal(codes, b.encode(images))
    with torch.no_grad():
        assert torch.equal(a.decode(codes), b.decode(codes))


# (1) round trips -----------------------------------------------------------------------------------

@pytest.mark.parametrize("wrapper", ["model", "module", "state_dict", None])
def test_official_checkpoint_layout_round_trips(tiny, images, tmp_path, wrapper):
    state = tiny.state_dict()
    path = tmp_path / "vq.pt"
    torch.save(state if wrapper is None else {wrapper: state, "steps": 10}, path)
    loaded = load_vq(path, TINY)
    assert not loaded.training
    assert_same_model(tiny, loaded, images)


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_save_vq_round_trips_without_passing_config(tiny, images, tmp_path, suffix):
    loaded = load_vq(save_vq(tiny, tmp_path / f"tok{suffix}"))
    assert loaded.config == TINY
    assert_same_model(tiny, loaded, images)


def test_load_from_state_dict_and_inferred_config(tiny, images):
    inferred = infer_vq_config(tiny.state_dict())
    # norm groups cannot be read off shapes; everything else can
    assert inferred == VQConfig(**{**TINY.__dict__, "norm_groups": inferred.norm_groups})
    assert_same_model(tiny, load_vq(dict(tiny.state_dict()), TINY), images)


def test_shapes(tiny, images):
    codes = tiny.encode(images)
    assert codes.shape == (2, 4, 6) and codes.dtype == torch.int64
    assert 0 <= codes.min() and codes.max() < 64
    with torch.no_grad():
        assert tiny.decode(codes).shape == images.shape


# (2) official VQ-16 layout --------------------------------------------------------------------------

# Names and shapes derived from FoundationVision/LlamaGen tokenizer/tokenizer_image/vq_model.py
# (VQ_16: ch 128, ch_mult [1,1,2,2,4], 2 res blocks, z 256, codebook 16384 x 8, codebook_show_usage).
OFFICIAL_VQ16 = {
    "encoder.conv_in.weight": (128, 3, 3, 3),
    "encoder.conv_blocks.0.res.0.norm1.weight": (128,),
    "encoder.conv_blocks.0.downsample.conv.weight": (128, 128, 3, 3),
    "encoder.conv_blocks.2.res.0.nin_shortcut.weight": (256, 128, 1, 1),
    "encoder.conv_blocks.4.res.1.conv2.weight": (512, 512, 3, 3),
    "encoder.conv_blocks.4.attn.1.q.weight": (512, 512, 1, 1),
    "encoder.mid.1.proj_out.weight": (512, 512, 1, 1),
    "encoder.mid.2.norm2.bias": (512,),
    "encoder.norm_out.weight": (512,),
    "encoder.conv_out.weight": (256, 512, 3, 3),
    "quant_conv.weight": (8, 256, 1, 1),
    "quantize.embedding.weight": (16384, 8),
    "quantize.codebook_used": (65536,),
    "post_quant_conv.weight": (256, 8, 1, 1),
    "decoder.conv_in.weight": (512, 256, 3, 3),
    "decoder.mid.0.conv1.weight": (512, 512, 3, 3),
    "decoder.conv_blocks.0.res.2.conv2.weight": (512, 512, 3, 3),
    "decoder.conv_blocks.0.attn.2.k.weight": (512, 512, 1, 1),
    "decoder.conv_blocks.0.upsample.conv.weight": (512, 512, 3, 3),
    "decoder.conv_blocks.1.res.0.nin_shortcut.weight": (256, 512, 1, 1),
    "decoder.conv_blocks.3.res.0.nin_shortcut.weight": (128, 256, 1, 1),
    "decoder.norm_out.weight": (128,),
    "decoder.conv_out.weight": (3, 128, 3, 3),
}


def test_default_config_has_official_vq16_keys_and_shapes():
    with torch.device("meta"):
        model = VQModel(VQConfig())
    state = model.state_dict()
    for key, shape in OFFICIAL_VQ16.items():
        assert key in state, key
        assert tuple(state[key].shape) == shape, key
    # the last level of each side has no resampler; only the lowest resolution has attention
    assert "encoder.conv_blocks.4.downsample.conv.weight" not in state
    assert "decoder.conv_blocks.4.upsample.conv.weight" not in state
    assert not any(k.startswith("encoder.conv_blocks.3.attn") or k.startswith("decoder.conv_blocks.1.attn") for k in state)
    assert len(state) == 344
    # LlamaGen README lists vq_ds16_c2i.pt as 72M parameters
    assert round(sum(p.numel() for p in model.parameters()) / 1e6) == 72
    assert VQConfig().downsample == 16


# (3) exact quantisation of code vectors ---------------------------------------------------------------

def test_quantize_is_exact_on_codebook_vectors(tiny):
    codebook = tiny.codebook
    assert torch.allclose(codebook.norm(dim=-1), torch.ones(64))
    perm = torch.randperm(64, generator=torch.Generator().manual_seed(2))
    indices = perm.view(2, 4, 8)
    grid = codebook[indices].permute(0, 3, 1, 2)  # [B, D, h, w]
    with torch.no_grad():
        zq, got = tiny.quantize(grid * 3.0)  # the l2-normalised quantiser ignores the scale
        assert torch.equal(got, indices)
        assert torch.equal(zq, grid)
        assert torch.equal(tiny.decode(indices), tiny.decode_code_vectors(grid))


def test_code_neighbours(tiny):
    nb = tiny.code_neighbours(3)
    assert nb.shape == (64, 3)
    assert not (nb == torch.arange(64)[:, None]).any()
    dist = torch.cdist(tiny.codebook, tiny.codebook)
    dist.fill_diagonal_(float("inf"))
    assert torch.equal(nb[:, 0], dist.argmin(dim=1))
    chosen = dist.gather(1, nb)
    assert (chosen[:, :-1] <= chosen[:, 1:]).all()
    assert torch.equal(tiny.code_neighbours(3, chunk=5), nb)
    with pytest.raises(InputError, match="k must be"):
        tiny.code_neighbours(64)


# (4) errors ----------------------------------------------------------------------------------------------

def test_missing_file_names_the_path(tmp_path):
    path = tmp_path / "nowhere" / "vq_ds16_c2i.pt"
    with pytest.raises(ModelNotFoundError, match="vq_ds16_c2i.pt"):
        load_vq(path)


def test_wrong_layout_names_missing_and_unexpected_keys(tiny, tmp_path):
    state = dict(tiny.state_dict())
    state["quantize.codebook"] = state.pop("quantize.embedding.weight")
    torch.save({"model": state}, tmp_path / "renamed.pt")
    with pytest.raises(InputError, match=r"missing key\(s\), first: quantize\.embedding\.weight.*"
                                         r"unexpected key\(s\), first: quantize\.codebook"):
        load_vq(tmp_path / "renamed.pt", TINY)
    with pytest.raises(InputError, match="wrong shape"):
        load_vq(tiny.state_dict(), VQConfig(**{**TINY.__dict__, "codebook_size": 32}))


def test_corrupt_files_give_one_line_input_errors(tmp_path):
    for name in ("junk.pt", "junk.safetensors"):
        (tmp_path / name).write_bytes(b"this is not a checkpoint at all" * 4)
        with pytest.raises(InputError) as err:
            load_vq(tmp_path / name)
        assert "\n" not in str(err.value) and name in str(err.value)
    torch.save({"model": {"a": 1}}, tmp_path / "notensors.pt")
    with pytest.raises(InputError, match="not a state dict"):
        load_vq(tmp_path / "notensors.pt")


def test_encode_rejects_bad_images(tiny):
    for bad, match in [(torch.zeros(3, 8, 8), r"\[B, 3, H, W\]"),
                       (torch.zeros(1, 1, 8, 8), r"\[B, 3, H, W\]"),
                       (torch.zeros(1, 3, 8, 8, dtype=torch.uint8), "float"),
                       (torch.zeros(1, 3, 7, 8), "multiples of 2"),
                       ([[0.0]], "torch.Tensor")]:
        with pytest.raises(InputError, match=match):
            tiny.encode(bad)


def test_decode_rejects_bad_indices(tiny):
    for bad, match in [(torch.zeros(2, 16, dtype=torch.long), r"\[B, h, w\]"),
                       (torch.zeros(1, 2, 2), "integer"),
                       (torch.full((1, 2, 2), 64), r"\[0, 63\]"),
                       (torch.full((1, 2, 2), -1), r"\[0, 63\]")]:
        with pytest.raises(InputError, match=match):
            tiny.decode(bad)
    with pytest.raises(InputError, match="float latent"):
        tiny.quantize(torch.zeros(1, 4, 2, 2))
    with pytest.raises(InputError, match="code vectors"):
        tiny.decode_code_vectors(torch.zeros(1, 4, 2, 2))


def test_bad_config_is_an_input_error():
    with pytest.raises(InputError, match="norm_groups"):
        VQConfig(ch=16, ch_mult=(1, 2))
