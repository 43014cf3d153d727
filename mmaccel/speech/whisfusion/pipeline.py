"""`WhisfusionPipeline`: audio in, transcripts out, through a Whisper encoder and a Whisfusion decoder.

    from mmaccel.speech.whisfusion.pipeline import WhisfusionPipeline
    pipe = WhisfusionPipeline.from_pretrained()                    # builtin:whisfusion-tiny.en
    out = pipe.transcribe(["a.wav"], "whisfusion", candidates=8, steps=4, select="rover")

Long audio is cut into windows of at most 30 s (`split_long`, as `ASRPipeline` does) and the windows'
transcripts joined. Outputs are `ASROutput`s (time split into features, encoder, decode; `passes`
counts decoder passes, each over all candidates of a batch).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch

from mmaccel.core.methods import Method, Resources
from mmaccel.core.plugin import MethodPlugin
from mmaccel.core.stats import DecodeStats, track_peak_memory
from mmaccel.errors import ModelNotFoundError, check
from mmaccel.paths import assets_dir
from mmaccel.speech.audio import AudioLike, log_mel
from mmaccel.speech.pipeline import ASROutput
from mmaccel.speech.timestamps import Segment
from mmaccel.speech.transcript import WindowResult, join_windows
from mmaccel.speech.whisfusion.methods import WHISFUSION_REGISTRY, EncodedWindows, build_whisfusion_method
from mmaccel.speech.whisfusion.model import TRAINED_PADDING, WhisfusionDecoder, read_config
from mmaccel.speech.whisper import WhisperBundle, load_whisper
from mmaccel.speech.windows import audio_windows

BUILTIN = {"builtin:whisfusion-tiny.en": "whisfusion_tiny_en"}
TRAIN_COMMAND = "python -m mmaccel.speech.whisfusion.train --out runs/whisfusion"


class WhisfusionPipeline:
    """A Whisper encoder and the Whisfusion decoder trained on it (`WhisfusionDecoder`), which decodes every
    position of a window's transcript in parallel over a few denoising steps; English only, no timestamps."""

    def __init__(self, bundle: WhisperBundle, decoder: WhisfusionDecoder):
        check(isinstance(bundle, WhisperBundle), f"bundle must be a WhisperBundle, got {type(bundle).__name__}")
        check(isinstance(decoder, WhisfusionDecoder), f"decoder must be a WhisfusionDecoder, got {type(decoder).__name__}")
        self.bundle, self.decoder = bundle, decoder.eval()

    @classmethod
    def from_pretrained(cls, source: str = "builtin:whisfusion-tiny.en", cache_dir: str | os.PathLike | None = None,
                        device: str | torch.device | None = None) -> WhisfusionPipeline:
        """`source`: the built-in decoder or a directory saved by `WhisfusionDecoder.save`; the Whisper it
        was trained on is loaded from the name recorded there."""
        from mmaccel.devices import resolve_device

        if source.startswith("builtin:"):
            check(source in BUILTIN, f"unknown built-in Whisfusion {source!r}; choose from {', '.join(BUILTIN)}")
            path = assets_dir() / BUILTIN[source]
            if not path.is_dir():
                raise ModelNotFoundError(f"{path} is missing: train it with `{TRAIN_COMMAND}`")
        else:
            path = Path(source).expanduser()
            check(path.is_dir(), f"{source!r} is neither a built-in name ({', '.join(BUILTIN)}) nor a directory")
        device = resolve_device(device)
        bundle = load_whisper(read_config(path)["whisper"], cache_dir)
        decoder = WhisfusionDecoder.load(path, bundle.model)
        bundle.model.to(device)
        return cls(bundle, decoder.to(device))

    @staticmethod
    def methods() -> dict[str, MethodPlugin]:
        """The methods `transcribe` takes: name -> plug-in (parameters, exactness, needs)."""
        return WHISFUSION_REGISTRY

    @torch.no_grad()
    def transcribe(self, audio: AudioLike | list, method: str | Method = "whisfusion", *, batch_size: int = 8,
                   sample_rate: int | None = None, seed: int = 0, **params: Any) -> ASROutput:
        """Transcribe one input or a list (paths, arrays with `sample_rate`, `Audio`s).

        `method`: a name from `WhisfusionPipeline.methods()` or a Method; `params` configure it (candidates,
        steps, temperature, select: see `whisfusion_decode`). Batch b of `batch_size` windows decodes with seed
        `seed + b * batch_size`.
        """
        spec = build_whisfusion_method(method, **params)
        check(isinstance(batch_size, int) and batch_size >= 1, f"batch_size must be an int >= 1, got {batch_size!r}")
        started = time.perf_counter()
        transcripts, windows = audio_windows(audio, sample_rate)
        stats, parts = DecodeStats(), {}
        prompt, eot = self.bundle.prompt("en"), self.bundle.tokens.end_of_text
        encoder, device = self.bundle.model.model.encoder, self.bundle.model.device
        resources = Resources(self.decoder)
        spec.check_needs(resources)
        for start in range(0, len(windows), batch_size):
            batch = windows[start:start + batch_size]
            with stats.timed("features"):
                features = log_mel(self.bundle.feature_extractor, [w.audio for w in batch], TRAINED_PADDING)
            with stats.timed("encoder"):
                states = encoder(features.to(device)).last_hidden_state
            encoded = EncodedWindows(states, [w.duration for w in batch], prompt, eot,
                                     lambda ids: self.bundle.tokenizer.decode(ids, skip_special_tokens=True))
            t0 = time.perf_counter()
            with track_peak_memory(stats, device):
                result = spec.runner(resources, encoded, seed=seed + start)
            stats.time_s["decode"] = stats.time_s.get("decode", 0.0) + time.perf_counter() - t0
            stats.nfe += result.passes
            stats.new_tokens += sum(len(t) for t in result.tokens)
            for window, text, tokens in zip(batch, result.texts, result.tokens):
                # the text may be a ROVER vote over candidates, not these tokens read back: no window_result here
                segment = [Segment(0, 0.0, window.duration, text, tokens)] if text else []
                parts.setdefault(window.input, {})[window.index] = WindowResult(tokens, text, segment, window.duration,
                                                                                window.place)
                transcripts[window.input].passes += result.passes
        join_windows(transcripts, parts)
        stats.time_s["transcribe"] = time.perf_counter() - started
        return ASROutput(transcripts, stats, spec.name)
