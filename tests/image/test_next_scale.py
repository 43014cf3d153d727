"""Next-scale decoding and CoDe: the cached loop's seeded sampling, the hand-off's exactness when the
refiner is the drafter, the drafter's cache holding only its scales, clear errors."""

import pytest
import torch
import torch.nn.functional as F

from mmaccel.core.sampling import Sampling
from mmaccel.core.stats import DecodeStats
from mmaccel.errors import InputError
from mmaccel.image.next_scale import ScaleSampling, collaborative_decode, decode_scales
from tests.image.test_msvq import TINY, tiny_model
from tests.image.test_var import tiny_var

LABELS = torch.tensor([0, 2, 4])


@pytest.fixture(scope="module")
def vq():
    return tiny_model()


def sample(model, vq, sampling=ScaleSampling(cfg=2.0, top_k=8), seed=3, **kw):
    return decode_scales(model, vq, LABELS, sampling, torch.Generator().manual_seed(seed), **kw)


def test_same_seed_same_pyramid_other_seed_other_pyramid(vq):
    model = tiny_var()
    a, nbytes = sample(model, vq)
    b, _ = sample(model, vq)
    c, _ = sample(model, vq, seed=4)
    assert [x.shape for x in a.indices] == [(3, p * p) for p in TINY.patch_nums]
    assert all(torch.equal(x, y) for x, y in zip(a.indices, b.indices))
    assert not all(torch.equal(x, y) for x, y in zip(a.indices, c.indices))
    assert nbytes == 2 * 2 * 6 * 30 * 8 * 4 * 4   # k and v, depth 2, 6 rows (CFG), 30 tokens, 4 heads x 8, fp32
    assert torch.allclose(a.f_hat, vq.quantize.f_hat(a.indices), atol=1e-5)


def test_code_with_the_drafter_as_refiner_is_plain_decoding(vq):
    model = tiny_var().double()
    vq64 = tiny_model().double()
    plain, _ = sample(model, vq64)
    for n in (1, 2, 3):
        stats = DecodeStats()
        handed, _ = collaborative_decode(model, model, vq64, LABELS, ScaleSampling(cfg=2.0, top_k=8),
                                         torch.Generator().manual_seed(3), n, stats)
        assert all(torch.equal(x, y) for x, y in zip(plain.indices, handed.indices)), n
        assert (stats.nfe, stats.draft_passes) == (n, 4 - n)


def test_code_keeps_the_drafters_scales_and_caches_less(vq):
    large, small = tiny_var(0), tiny_var(1, depth=1, embed_dim=16, num_heads=2)
    plain, plain_bytes = sample(large, vq)
    handed, code_bytes = collaborative_decode(large, small, vq, LABELS, ScaleSampling(cfg=2.0, top_k=8),
                                              torch.Generator().manual_seed(3), 2)
    assert all(torch.equal(x, y) for x, y in zip(plain.indices[:2], handed.indices[:2]))
    assert not all(torch.equal(x, y) for x, y in zip(plain.indices[2:], handed.indices[2:]))
    assert code_bytes == plain_bytes // 4   # the larger cache: the refiner's (half as wide, half as deep;
                                            # the drafter holds 5 of 30 tokens)


def test_the_refiner_may_have_its_own_sampling(vq):
    model = tiny_var().double()
    vq64 = tiny_model().double()
    sampling = ScaleSampling(cfg=2.0, top_k=8)

    def handed(refiner_sampling):
        out, _ = collaborative_decode(model, model, vq64, LABELS, sampling, torch.Generator().manual_seed(3), 2,
                                      refiner_sampling=refiner_sampling)
        return out.indices

    same, other = handed(sampling), handed(ScaleSampling(cfg=0.0, top_k=8))
    assert all(torch.equal(x, y) for x, y in zip(same, handed(None)))
    assert all(torch.equal(x, y) for x, y in zip(same[:2], other[:2]))            # the drafter's scales stay
    assert not all(torch.equal(x, y) for x, y in zip(same[2:], other[2:]))


def test_per_scale_temperature_and_top_p(vq):
    model = tiny_var()
    out, _ = sample(model, vq, ScaleSampling(cfg=0.0, top_p=0.5, temperature=(1.0, 1.0, 0.5, 0.5)))
    assert len(out.indices) == 4
    with pytest.raises(InputError, match="4 scales"):
        sample(model, vq, ScaleSampling(temperature=(1.0, 1.0)))


@pytest.mark.parametrize("sampling", [ScaleSampling(top_k=4), ScaleSampling(top_p=0.7),
                                      ScaleSampling(top_k=5, top_p=0.8, temperature=(1.0, 0.5))])
def test_the_draw_follows_the_warped_categorical(sampling):
    """The inverse-CDF draw gives top-k, then top-p, then the scale's temperature (`Sampling.warp`'s
    categorical): empirical TV within sampling noise, no draw without mass; the negative control (the
    same draws against the unwarped softmax) is far off."""
    V, rows, draws = 12, 3, 50_000
    logits = torch.randn(rows, V, generator=torch.Generator().manual_seed(0))
    codes = sampling.sample(logits[:, None].expand(rows, draws, V), 1, 2, torch.Generator().manual_seed(1))
    temperature = sampling.temperature_at(1, 2)
    warped = Sampling(temperature=1.0, top_k=sampling.top_k, top_p=sampling.top_p).warp(logits)
    target = (warped / temperature).softmax(-1)
    freq = F.one_hot(codes, V).float().mean(1)
    assert (0.5 * (freq - target).abs().sum(-1)).max() < 0.02
    assert freq[target == 0].sum() == 0
    control = (logits / temperature).softmax(-1)
    assert (0.5 * (freq - control).abs().sum(-1)).min() > 0.05


@pytest.mark.parametrize("kwargs", [{"cfg": -1}, {"top_k": -2}, {"top_p": 0}, {"temperature": 0}, {"temperature": (1, -1)}])
def test_bad_sampling(kwargs):
    with pytest.raises(InputError):
        ScaleSampling(**kwargs)


@pytest.mark.parametrize("n", [0, 4, 9, 2.5])
def test_draft_steps_out_of_range(vq, n):
    model = tiny_var()
    with pytest.raises(InputError, match="draft_steps"):
        collaborative_decode(model, model, vq, LABELS, ScaleSampling(), torch.Generator(), n)


def test_mismatched_tokenizers_and_models(vq):
    other_vocab = tiny_var(vocab_size=64)
    with pytest.raises(InputError, match="not trained together"):
        collaborative_decode(tiny_var(), other_vocab, vq, LABELS, ScaleSampling(), torch.Generator(), 2)
    other_schedule = tiny_var(patch_nums=(1, 2, 4))
    with pytest.raises(InputError, match="scale schedule"):
        sample(other_schedule, vq)
    other_classes = tiny_var(num_classes=7)
    with pytest.raises(InputError, match="classes"):
        collaborative_decode(tiny_var(), other_classes, vq, LABELS, ScaleSampling(), torch.Generator(), 2)
