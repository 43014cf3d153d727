"""The MAR-style model (image.models.mar): its diffusion head's schedule, layout and errors; MAR sampling
(image.masked)."""

import pytest
import torch

from mmaccel.core.stats import DecodeStats
from mmaccel.errors import InputError
from mmaccel.image.masked import MaskedSampling, masked_decode, reveal_counts
from mmaccel.image.models.mar import MAR, Diffusion, MARConfig, load_mar, save_mar

CONFIG = MARConfig(seq_len=9, token_dim=3, num_classes=4, width=32, depth=2, heads=2, buffer=2, head_width=32,
                   head_depth=2)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = MAR(CONFIG).eval()
    with torch.no_grad():                      # a non-trivial (not adaLN-zero) head
        for p in m.head.parameters():
            p.add_(0.02 * torch.randn_like(p))
    return m


def test_posterior_step_is_diffusers_ddpm_step():
    """Our (mean, std) of one DDPM step from a velocity prediction equals diffusers' `DDPMScheduler.step`
    with the same noise."""
    diffusion = Diffusion(1000, "squaredcos_cap_v2")
    times = diffusion.sampling_timesteps(10)
    scheduler = diffusion.scheduler
    scheduler.set_timesteps(timesteps=times[:-1])
    g = torch.Generator().manual_seed(0)
    x, v = torch.randn(5, 3, generator=g), torch.randn(5, 3, generator=g)
    for t, t_prev in zip(times[:-2], times[1:-1]):     # diffusers' last step (t -> -1) is deterministic
        noise = torch.randn(5, 3, generator=torch.Generator().manual_seed(t))
        ours_mean, ours_std = diffusion.posterior(x, v, t, t_prev)
        theirs = scheduler.step(v, t, x, generator=torch.Generator().manual_seed(t)).prev_sample
        assert torch.allclose(ours_mean + ours_std * noise, theirs, atol=1e-5)
    _, last_std = diffusion.posterior(x, v, times[-2], 0)
    assert 0 < last_std < 0.05                         # our chain ends with a proper, narrow Gaussian


def test_planned_chain_equals_the_heads_forward(model):
    """`plan` once + `step` per step (the sampler's path) gives the velocity of `forward(x, t, z)`."""
    times = torch.tensor(model.diffusion.sampling_timesteps(6)[:-1])
    g = torch.Generator().manual_seed(0)
    z, x = torch.randn(5, CONFIG.width, generator=g), torch.randn(5, CONFIG.token_dim, generator=g)
    with torch.no_grad():
        plan = model.head.plan(times, z)
        for i, t in enumerate(times.tolist()):
            expected = model.head(x, torch.full((5,), t), z)
            assert torch.allclose(model.head.step(x, plan, i), expected, atol=1e-6)
            assert expected.abs().max() > 1e-3          # the random head is not the adaLN-zero identity


def test_reveal_counts_follow_mars_cosine_schedule():
    assert reveal_counts(64, 64) == [1] * 64
    counts = reveal_counts(256, 64)
    assert sum(counts) == 256 and len(counts) == 64 and min(counts) >= 1 and counts[0] == 1 and counts[-1] > 4
    assert reveal_counts(9, 1) == [9]
    with pytest.raises(InputError, match="num_iter"):
        reveal_counts(9, 10)


def test_masked_decode_is_seeded_and_counts_passes(model):
    labels = torch.tensor([0, 3])
    runs = []
    for num_iter in (9, 3, 3):
        stats = DecodeStats()
        tokens = masked_decode(model, labels, MaskedSampling(num_iter=num_iter, cfg=2.0, diffusion_steps=5),
                               torch.Generator().manual_seed(1), stats)
        assert tokens.shape == (2, 9, 3) and torch.isfinite(tokens).all()
        assert stats.nfe == num_iter and stats.new_tokens == 18
        runs.append(tokens)
    assert torch.equal(runs[1], runs[2]) and not torch.equal(runs[0], runs[1])
    unguided = masked_decode(model, labels, MaskedSampling(num_iter=3, cfg=1.0, diffusion_steps=5),
                             torch.Generator().manual_seed(1))
    assert not torch.equal(unguided, runs[1])


def test_sampling_parameters_are_checked(model):
    labels = torch.tensor([0])
    g = torch.Generator().manual_seed(0)
    for bad, match in [({"cfg": 0.5}, "cfg"), ({"cfg_schedule": "cosine"}, "cfg_schedule"),
                       ({"temperature": 0}, "temperature"), ({"diffusion_steps": 0}, "diffusion_steps"),
                       ({"num_iter": 0}, "num_iter")]:
        with pytest.raises(InputError, match=match):
            masked_decode(model, labels, MaskedSampling(**{"num_iter": 9, **bad}), g)


def test_save_load_round_trip_and_layout_errors(model, tmp_path):
    path = save_mar(model, tmp_path / "mar.safetensors")
    again = load_mar(path)
    assert again.config == CONFIG
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    half = load_mar(save_mar(model, tmp_path / "half.safetensors", dtype=torch.float16))
    assert half.token_proj.weight.dtype == torch.float32
    state = dict(model.state_dict())
    state.pop("mask_token")
    with pytest.raises(InputError, match="mask_token"):
        load_mar(state, CONFIG)
    with pytest.raises(InputError, match="no MAR config"):
        load_mar(state)
    with pytest.raises(InputError, match="safetensors"):
        save_mar(model, tmp_path / "mar.pt")


def test_bad_shapes_and_configs_are_clear_errors(model):
    with pytest.raises(InputError, match="tokens must be"):
        model.condition(torch.zeros(1, 8, 3), torch.zeros(1, 8, dtype=torch.bool), torch.tensor([0]))
    with pytest.raises(InputError, match="known"):
        model.condition(torch.zeros(1, 9, 3), torch.zeros(1, 9), torch.tensor([0]))
    with pytest.raises(InputError, match="square"):
        MARConfig(seq_len=10)
    with pytest.raises(InputError, match="divisible"):
        MARConfig(width=30, heads=4)
