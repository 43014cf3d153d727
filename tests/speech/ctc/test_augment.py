"""Waveform augmentation: lengths, SNRs, finiteness and determinism."""

import numpy as np
import pytest

from mmaccel.speech.ctc.augment import (
    add_noise,
    augment,
    babble_noise,
    pink_noise,
    reverberate,
    room_impulse_response,
    speed_perturb,
    white_noise,
)

N = 16000


def tone(n: int = N, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(n) / 16000
    return (0.3 * np.sin(2 * np.pi * 220 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))
            + 0.01 * rng.standard_normal(n)).astype(np.float32)


def snr_db(clean: np.ndarray, noisy: np.ndarray) -> float:
    noise = noisy.astype(np.float64) - clean
    return 10 * np.log10(np.sum(clean.astype(np.float64) ** 2) / np.sum(noise ** 2))


@pytest.mark.parametrize("factor", [0.9, 1.0, 1.1])
def test_speed_changes_length_by_the_factor(factor):
    out = speed_perturb(tone(), factor)
    assert abs(len(out) - N / factor) <= 2 and np.isfinite(out).all() and out.dtype == np.float32


@pytest.mark.parametrize("kind", ["white", "pink", "babble"])
@pytest.mark.parametrize("snr", [5.0, 20.0])
def test_noise_at_the_requested_snr(kind, snr):
    rng = np.random.default_rng(1)
    clean = tone()
    noise = white_noise(N, rng) if kind == "white" else pink_noise(N, rng) if kind == "pink" else \
        babble_noise(N, [tone(7000, s) for s in range(4)], rng)
    noisy = add_noise(clean, noise, snr)
    assert abs(snr_db(clean, noisy) - snr) < 1.0 and len(noisy) == N


def test_pink_noise_falls_with_frequency():
    power = np.abs(np.fft.rfft(pink_noise(1 << 15, np.random.default_rng(0)))) ** 2
    f = np.fft.rfftfreq(1 << 15, 1 / 16000)
    low, high = power[(f > 50) & (f < 200)].mean(), power[(f > 3200) & (f < 12800)].mean()
    assert 10 * np.log10(low / high) > 15                  # 1/f: ~ 10 log10(64) = 18 dB apart


def test_reverberation_keeps_length_and_level():
    rir = room_impulse_response(0.5, np.random.default_rng(0))
    assert len(rir) == 8000 and np.linalg.norm(rir) == pytest.approx(1.0, abs=1e-5) and np.argmax(np.abs(rir)) == 0
    wet = reverberate(tone(), rir)
    assert len(wet) == N and np.isfinite(wet).all()
    assert np.sqrt(np.mean(wet ** 2)) == pytest.approx(np.sqrt(np.mean(tone() ** 2)), rel=1e-3)


def test_augment_is_finite_and_deterministic():
    others = [tone(9000, s) for s in range(1, 5)]
    outs = [augment(tone(), np.random.default_rng(seed), others) for seed in range(12)]
    for out in outs:
        assert np.isfinite(out).all() and np.abs(out).max() <= 1.0 and out.dtype == np.float32
        assert N / 1.1 - 2 <= len(out) <= N / 0.9 + 2
    again = augment(tone(), np.random.default_rng(3), others)
    np.testing.assert_array_equal(again, outs[3])
    assert len({out.tobytes() for out in outs}) >= 8         # seeds differ (a few draw no reverb nor noise)
