"""Waveform augmentation for training CTC heads on synthetic (TTS) speech.

TTS voices are clean, dry and metronomic; the augmentations push the training audio towards real
recordings: speed perturbation (Ko et al. 2015: resampling by 0.9 / 1.0 / 1.1, which changes tempo
and pitch together, as Kaldi's recipes do), reverberation with a synthetic room impulse response
(exponentially decaying Gaussian noise, Lehmann & Johansson 2008's late-reverberation model, with a
direct-path impulse) and additive noise at a random signal-to-noise ratio: white, pink (1/f power,
shaped in the frequency domain) or babble (a sum of other utterances, as in MUSAN-style recipes).

Every function takes 16 kHz mono float32 samples and returns a new array; `augment` draws all its
choices from the `numpy.random.Generator` it is given, so the same seed gives the same audio.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torchaudio.functional as AF

from mmaccel.errors import check
from mmaccel.speech.audio import SAMPLE_RATE

SPEED_FACTORS = (0.9, 1.0, 1.1)
SNR_DB = (5.0, 25.0)                 # additive noise: SNR drawn uniformly in this range
RT60_S = (0.2, 0.8)                  # reverberation time (60 dB decay) drawn uniformly in this range
NOISE_KINDS = ("white", "pink", "babble")
BABBLE_TALKERS = 3
P_REVERB, P_NOISE = 0.3, 0.6         # chance that `augment` adds each; speed is drawn from SPEED_FACTORS always
DECAY_60DB = np.log(1000.0)          # amplitude falls by 10^3 (60 dB) over RT60
PEAK = 0.99


def _tensor(samples: np.ndarray) -> torch.Tensor:
    check(isinstance(samples, np.ndarray) and samples.ndim == 1 and len(samples) > 0,
          f"samples must be a non-empty 1-D array, got {getattr(samples, 'shape', type(samples).__name__)}")
    return torch.from_numpy(np.ascontiguousarray(samples, dtype=np.float32))


def speed_perturb(samples: np.ndarray, factor: float) -> np.ndarray:
    """Play `samples` `factor` times faster (length / factor; pitch moves with the tempo)."""
    check(0.5 <= factor <= 2.0, f"speed factor must be in [0.5, 2], got {factor}")
    if factor == 1.0:
        return np.array(samples, dtype=np.float32)
    out, _ = AF.speed(_tensor(samples)[None], SAMPLE_RATE, float(factor))
    return out[0].numpy()


def white_noise(n: int, rng: np.random.Generator) -> np.ndarray:
    return rng.standard_normal(n).astype(np.float32)


def pink_noise(n: int, rng: np.random.Generator) -> np.ndarray:
    """Noise with power falling as 1/f: white noise with its spectrum scaled by 1/sqrt(f) (DC removed)."""
    spectrum = np.fft.rfft(rng.standard_normal(n))
    f = np.fft.rfftfreq(n)
    spectrum[1:] /= np.sqrt(f[1:])
    spectrum[0] = 0.0
    noise = np.fft.irfft(spectrum, n)
    return (noise / (noise.std() + 1e-12)).astype(np.float32)


def babble_noise(n: int, others: Sequence[np.ndarray], rng: np.random.Generator,
                 talkers: int = BABBLE_TALKERS) -> np.ndarray:
    """The sum of `talkers` utterances drawn from `others` (each at unit RMS, looped and cut to `n`
    samples from a random offset)."""
    check(len(others) > 0, "babble noise needs other utterances to mix")
    out = np.zeros(n, dtype=np.float64)
    for i in rng.choice(len(others), size=talkers, replace=len(others) < talkers):
        voice = np.asarray(others[i], dtype=np.float64)
        voice = np.tile(voice, n // len(voice) + 2)
        start = int(rng.integers(0, len(voice) - n + 1))
        piece = voice[start:start + n]
        out += piece / (np.sqrt(np.mean(piece ** 2)) + 1e-12)
    return out.astype(np.float32)


def add_noise(samples: np.ndarray, noise: np.ndarray, snr_db: float) -> np.ndarray:
    """`samples` plus `noise` scaled so that signal power / noise power is `snr_db` dB (over the whole clip)."""
    check(len(noise) == len(samples), f"noise has {len(noise)} samples, the signal {len(samples)}")
    out = AF.add_noise(_tensor(samples)[None], _tensor(noise)[None], torch.tensor([float(snr_db)]))
    return out[0].numpy()


def room_impulse_response(rt60: float, rng: np.random.Generator) -> np.ndarray:
    """A synthetic RIR of `rt60` seconds: a direct-path impulse, then Gaussian noise under an envelope
    exp(-ln(1000) t / rt60) (60 dB down at rt60); unit energy."""
    check(0.05 <= rt60 <= 3.0, f"RT60 must be in [0.05, 3] s, got {rt60}")
    n = int(rt60 * SAMPLE_RATE)
    t = np.arange(n) / SAMPLE_RATE
    rir = rng.standard_normal(n) * np.exp(-DECAY_60DB * t / rt60)
    rir[0] = np.abs(rir).max() * 2.0                        # the direct sound leads the reflections
    return (rir / np.linalg.norm(rir)).astype(np.float32)


def reverberate(samples: np.ndarray, rir: np.ndarray) -> np.ndarray:
    """`samples` convolved with `rir`, cut to the input length and brought back to the input's RMS."""
    wet = AF.fftconvolve(_tensor(samples), _tensor(rir))[:len(samples)].numpy()
    rms_in, rms_out = np.sqrt(np.mean(samples.astype(np.float64) ** 2)), np.sqrt(np.mean(wet.astype(np.float64) ** 2))
    return (wet * (rms_in / rms_out if rms_out > 0 else 1.0)).astype(np.float32)


def augment(samples: np.ndarray, rng: np.random.Generator, others: Sequence[np.ndarray] = ()) -> np.ndarray:
    """One random training version of `samples`: speed in `SPEED_FACTORS`; reverberation with chance
    `P_REVERB` (RT60 in `RT60_S`); noise with chance `P_NOISE` (white, pink, or babble from `others`
    when given; SNR in `SNR_DB`); then scaled down if its peak exceeds 0.99. Deterministic given `rng`."""
    out = speed_perturb(samples, float(rng.choice(SPEED_FACTORS)))
    if rng.random() < P_REVERB:
        out = reverberate(out, room_impulse_response(float(rng.uniform(*RT60_S)), rng))
    if rng.random() < P_NOISE:
        kinds = NOISE_KINDS if len(others) > 0 else NOISE_KINDS[:2]
        kind = kinds[int(rng.integers(len(kinds)))]
        noise = white_noise(len(out), rng) if kind == "white" else pink_noise(len(out), rng) if kind == "pink" \
            else babble_noise(len(out), others, rng)
        out = add_noise(out, noise, float(rng.uniform(*SNR_DB)))
    peak = float(np.abs(out).max())
    return (out * (PEAK / peak) if peak > PEAK else out).astype(np.float32)
