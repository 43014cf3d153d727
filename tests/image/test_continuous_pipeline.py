"""ContinuousPipeline: loading (directory, file + tokenizer, built-in), the four methods, stats and clear errors."""

import pytest
import torch

from mmaccel.errors import InputError, ModelNotFoundError
from mmaccel.image.continuous_methods import build_continuous_method
from mmaccel.image.continuous_pipeline import BUILTIN_CONTINUOUS, BUILTIN_CONTINUOUS_FILES, ContinuousPipeline
from mmaccel.image.models.mar import MAR, MARConfig, save_mar
from mmaccel.image.pipeline import ImageOutput
from mmaccel.image.tokenizers.kl import KLConfig, KLTokenizer, save_kl
from mmaccel.registries import method_registry

KL = KLConfig(channels=(8, 16), latent_channels=2, norm_groups=4, image_size=8)       # 4x4 = 16 tokens


def tiny_mar(seed: int, width: int = 32, depth: int = 1) -> MAR:
    torch.manual_seed(seed)
    model = MAR(MARConfig(seq_len=16, token_dim=2, num_classes=10, width=width, depth=depth, heads=2, buffer=1,
                          head_width=32, head_depth=1))
    with torch.no_grad():                  # small, non-zero noise predictions
        model.head.out.weight.normal_(0, 0.01)
    return model.eval()


def write_tiny_models(path):
    """A model directory: kl, mar (the target) and mar_draft safetensors with tiny random weights."""
    torch.manual_seed(0)
    save_kl(KLTokenizer(KL), path / "kl.safetensors")
    save_mar(tiny_mar(0), path / "mar.safetensors")
    save_mar(tiny_mar(1, width=16), path / "mar_draft.safetensors")
    return path


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_tiny_models(tmp_path_factory.mktemp("mar"))


@pytest.fixture(scope="module")
def pipe(folder):
    return ContinuousPipeline.from_pretrained(folder)


def test_methods_and_their_stats(pipe):
    kw = {"seed": 0, "diffusion_steps": 4}
    ar = pipe.generate([0, 1, 4], "ar", **kw)
    assert len(ar.images) == 3 and ar.images[0].size == (64, 64)
    assert ar.tokens.shape == (3, 16, 2) and (ar.stats.nfe, ar.stats.draft_passes) == (16, 0)
    assert ar.stats.new_tokens == 48 and ar.stats.wall_s > 0
    mar = pipe.generate([0, 1, 4], "mar", **kw)
    assert mar.stats.nfe == 4                                 # 16 tokens, 4 a step on average
    assert torch.equal(pipe.generate([0, 1, 4], "mar", **kw).tokens, mar.tokens)
    draft = pipe.generate([0, 1, 4], "ar-draft", **kw)
    assert (draft.stats.nfe, draft.stats.draft_passes) == (0, 16)
    cspd = pipe.generate([0, 1, 4], "cspd", num_draft=4, **kw)
    # steps 0..2 by the target (floor(0.15 * 16) = 2), then blocks of 4, 4, 4 and 1 drafts
    assert (cspd.stats.nfe, cspd.stats.draft_passes) == (3 + 4, 13)
    assert sum(cspd.stats.accepted_hist.values()) == 3 * 4
    assert pipe.decode_pixels(ar.tokens).shape == (3, 3, 64, 64)


def test_shared_noise_makes_the_prefill_identical_to_ar(pipe):
    """Same seed -> same reveal order and noise: CSpD's pre-filled tokens are the AR run's."""
    ar = pipe.generate([2, 5], "ar", seed=3, diffusion_steps=4)
    cspd = pipe.generate([2, 5], "cspd", seed=3, diffusion_steps=4, prefill_ratio=0.5)
    # floor(0.5 * 16) = 8: steps 0..8 are the target's, then the drafts differ
    assert torch.equal((ar.tokens == cspd.tokens).all(-1).sum(1), torch.tensor([9, 9]))


def test_mar_tokens_per_step_and_the_schedule_option(pipe):
    """mar's own schedule is L // tokens_per_step steps (1: ar's tokens); `num_iter` is every method's schedule."""
    kw = {"seed": 1, "diffusion_steps": 3}
    ar = pipe.generate([0, 3], "ar", **kw)
    assert torch.equal(pipe.generate([0, 3], "mar", tokens_per_step=1, **kw).tokens, ar.tokens)
    two = pipe.generate([0, 3], "mar", tokens_per_step=2, **kw)
    assert two.stats.nfe == 8 and torch.equal(pipe.generate([0, 3], "ar", num_iter=8, **kw).tokens, two.tokens)
    assert torch.equal(pipe.generate([0, 3], "cspd", num_draft=None, **kw).tokens,
                       pipe.generate([0, 3], "cspd", num_draft=8, **kw).tokens)          # None: the default
    assert pipe.methods() is method_registry("image-continuous") and isinstance(ar, ImageOutput)
    assert build_continuous_method("mar", tokens_per_step=1).lossless and not build_continuous_method("mar").lossless
    assert build_continuous_method("cspd", num_draft=1, inner_temperature=1.0).lossless
    assert not build_continuous_method("cspd").lossless and not build_continuous_method("ar-draft").lossless


def test_file_needs_its_tokenizer_and_a_draft_for_cspd(folder):
    with pytest.raises(InputError, match="tokenizer=PATH"):
        ContinuousPipeline.from_pretrained(folder / "mar.safetensors")
    pipe = ContinuousPipeline.from_pretrained(folder / "mar.safetensors", tokenizer=folder / "kl.safetensors")
    assert pipe.draft is None
    with pytest.raises(InputError, match="needs a draft"):
        pipe.generate([0], "cspd")
    with pytest.raises(ModelNotFoundError, match="not found"):
        ContinuousPipeline.from_pretrained(folder / "missing.safetensors", tokenizer=folder / "kl.safetensors")
    with pytest.raises(ModelNotFoundError, match="unknown built-in"):
        ContinuousPipeline.from_pretrained("builtin:nothing")


def test_mismatched_models_are_refused(folder, tmp_path):
    torch.manual_seed(0)
    other = MAR(MARConfig(seq_len=9, token_dim=2, num_classes=10, width=16, depth=1, heads=2, buffer=1,
                          head_width=16, head_depth=1))
    save_mar(other, tmp_path / "other.safetensors")
    with pytest.raises(InputError, match="tokenizer makes 16"):
        ContinuousPipeline.from_pretrained(tmp_path / "other.safetensors", tokenizer=folder / "kl.safetensors")


@pytest.mark.parametrize("kwargs, match", [
    ({"method": "speculative"}, "unknown continuous-token method"),
    ({"method": "ar", "num_draft": 3}, r"method 'ar' does not take parameter\(s\) num_draft; it takes none"),
    ({"method": "mar", "tokens_per_step": 0}, r"tokens_per_step must be an integer in \[1, 65536\], got 0"),
    ({"method": "cspd", "inner_temperature": 0.0}, "inner_temperature must be positive"),
    ({"method": "cspd", "num_draft": 0}, "num_draft"),
    ({"method": "cspd", "inner_temperature": -1.0}, "inner_temperature"),
    ({"num_iter": 17}, "num_iter"),
    ({"cfg": 0.0}, "cfg"),
    ({"diffusion_steps": 1000}, "diffusion_steps"),
    ({"seed": 1.5}, "seed"),
])
def test_bad_parameters_are_clear_errors(pipe, kwargs, match):
    kwargs = {"method": "ar", **kwargs}
    with pytest.raises(InputError, match=match):
        pipe.generate([0], **kwargs)
    with pytest.raises(InputError, match="class"):
        pipe.generate([10], "ar")


def test_the_builtin_models_load():
    if not all(p.is_file() for p in BUILTIN_CONTINUOUS_FILES.values()):
        pytest.skip("the built-in continuous-token models are not trained yet")
    pipe = ContinuousPipeline.from_pretrained(BUILTIN_CONTINUOUS)
    out = pipe.generate([0, 9], "cspd", seed=0, diffusion_steps=5)
    assert len(out.images) == 2 and out.stats.nfe < 64 and pipe.class_names[9] == "Ankle boot"
