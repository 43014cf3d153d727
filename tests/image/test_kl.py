"""The KL tokenizer (image.tokenizers.kl)."""

import pytest
import torch

from mmaccel.errors import InputError
from mmaccel.image.tokenizers.kl import KLConfig, KLTokenizer, load_kl, save_kl

CONFIG = KLConfig(channels=(8, 16), latent_channels=3, norm_groups=4, image_size=16, scale=2.0)


@pytest.fixture(scope="module")
def tokenizer():
    torch.manual_seed(0)
    return KLTokenizer(CONFIG).eval()


def test_tokens_are_scaled_latents_in_raster_order(tokenizer):
    x = torch.rand(2, 3, 16, 16) * 2 - 1
    with torch.no_grad():
        tokens = tokenizer.encode(x)
        latents = tokenizer.posterior(x).mean
        assert tokens.shape == (2, 64, 3) and tokenizer.seq_len == 64 and tokenizer.token_dim == 3
        assert torch.allclose(tokens[:, 9], latents[:, :, 1, 1] * 2.0)       # row 1, column 1
        assert torch.allclose(tokenizer.decode(tokens), tokenizer.vae.decode(latents).sample, atol=1e-5)
        sampled = tokenizer.encode(x, torch.Generator().manual_seed(0))
        assert not torch.equal(sampled, tokens)


def test_save_load_round_trip(tokenizer, tmp_path):
    again = load_kl(save_kl(tokenizer, tmp_path / "kl.safetensors"))
    assert again.config == CONFIG
    x = torch.rand(1, 3, 16, 16)
    with torch.no_grad():
        assert torch.equal(again.encode(x), tokenizer.encode(x))
    with pytest.raises(InputError, match="no KL tokenizer config"):
        load_kl(dict(tokenizer.state_dict()))
    state = dict(tokenizer.state_dict())
    state["extra.weight"] = torch.zeros(1)
    with pytest.raises(InputError, match="extra.weight"):
        load_kl(state, CONFIG)


def test_bad_inputs_are_clear_errors(tokenizer):
    with pytest.raises(InputError, match="images must be"):
        tokenizer.encode(torch.zeros(1, 1, 16, 16))
    with pytest.raises(InputError, match="tokens must be"):
        tokenizer.decode(torch.zeros(1, 63, 3))
    with pytest.raises(InputError, match="multiple"):
        KLConfig(channels=(8, 16), norm_groups=4, image_size=15)
