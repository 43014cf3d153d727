"""`mmaccel bench asr-stream`: live transcription at real time — how long each word waits, and what streaming
costs in WER against transcribing the same audio offline.

The audio is one stream of real speech: the real clips (LibriVox, cards, ALSA), one after another with
half-second pauses, played at its own pace (`realtime_chunks`, 0.1-s chunks) into `ASRPipeline.stream`, on
the same process and threads as every other suite. Per method: the committed words' emission delays (the
wall time of a word's commit minus the moment its end was spoken; median, p90, max), the streaming WER and
the offline WER of the same method on the same stream (the whole stream in 30-s windows, no streaming),
against the clips' references joined. A lossless method commits greedy's words, only sooner.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from collections.abc import Callable

import numpy as np
import torch

from mmaccel.bench.harness import MethodSpec, device_name
from mmaccel.metrics.wer import corpus_wer, normalizer_version
from mmaccel.speech.audio import SAMPLE_RATE, load_audio

DEFAULT_METHODS = [MethodSpec("greedy"), MethodSpec("eagle", {"k": 4, "stop_below": 0.0}, label="eagle-k4"),
                   MethodSpec("speculative", {"k": 4}, label="speculative-k4")]
PAUSE_S, CHUNK_S = 0.5, 0.1
QUICK_CLIPS = 4


def stream_corpus(quick: bool) -> tuple[np.ndarray, str]:
    """(16 kHz samples, reference): the real clips joined with pauses (the first `QUICK_CLIPS` when quick)."""
    from mmaccel.speech.data import real_utterances

    utts = real_utterances()[: QUICK_CLIPS if quick else None]
    pause = np.zeros(int(PAUSE_S * SAMPLE_RATE), np.float32)
    samples = np.concatenate([x for u in utts for x in (load_audio(u.audio_filepath).samples, pause)])
    return samples, " ".join(u.text for u in utts)


def run_stream_bench(model: str = "builtin:base", methods: list[MethodSpec] | None = None, quick: bool = False,
                     min_chunk_s: float = 1.0, trim_s: float = 15.0, pipeline=None,
                     log: Callable[[str], None] = print) -> dict:
    """The result document: a row per method (delays in seconds, WER in %)."""
    from mmaccel.speech.pipeline import ASRPipeline
    from mmaccel.speech.streaming import realtime_chunks

    methods = [MethodSpec("greedy")] + [m for m in methods if m.name not in ("ar", "greedy")] if methods else DEFAULT_METHODS
    asr = pipeline or ASRPipeline.from_pretrained(model)
    samples, reference = stream_corpus(quick)
    audio_s = len(samples) / SAMPLE_RATE
    load_before = os.getloadavg()[0]
    rows = []
    for spec in methods:
        asr.transcribe((samples[: 5 * SAMPLE_RATE], SAMPLE_RATE), spec.name, word_timestamps=True, **spec.params)  # warm
        log(f"[asr-stream] {spec.key}: {audio_s:.0f} s at real time")
        t0 = time.perf_counter()
        words = [w for u in asr.stream(realtime_chunks(samples, SAMPLE_RATE, CHUNK_S), spec.name,
                                       min_chunk_s=min_chunk_s, trim_s=trim_s, **spec.params) for w in u.committed]
        wall = time.perf_counter() - t0
        offline = asr.transcribe((samples, SAMPLE_RATE), spec.name, **spec.params).texts[0]
        streamed = "".join(w.word for w in words).strip()
        delays = np.array([w.delay for w in words]) if words else np.zeros(1)
        rows.append({"method": spec.key, "name": spec.name, "params": spec.params, "words": len(words),
                     "delay_median_s": round(float(np.median(delays)), 3),
                     "delay_p90_s": round(float(np.percentile(delays, 90)), 3),
                     "delay_max_s": round(float(delays.max()), 3),
                     "wer_stream": round(100 * corpus_wer([reference], [streamed]).wer, 2),
                     "wer_offline": round(100 * corpus_wer([reference], [offline]).wer, 2),
                     "wall_s": round(wall, 2), "transcript": streamed})
    return {"suite": "asr-stream", "date": dt.date.today().isoformat(), "device": device_name(asr.model.device),
            "torch": torch.__version__, "threads": torch.get_num_threads(), "load_before": round(load_before, 2),
            "config": {"model": asr.bundle.name, "mel_padding": asr.mel_padding, "audio_s": round(audio_s, 1), "chunk_s": CHUNK_S,
                       "min_chunk_s": min_chunk_s, "trim_s": trim_s, "pause_s": PAUSE_S, "quick": quick,
                       "audio": f"{'the first ' + str(QUICK_CLIPS) if quick else 'all'} real clips, one stream",
                       "wer": f"corpus WER, {normalizer_version()}"},
            "results": rows}


def markdown(doc: dict) -> str:
    lines = ["| method | words | delay median (s) | p90 (s) | max (s) | WER streaming | WER offline |",
             "|---|---|---|---|---|---|---|"]
    for r in doc["results"]:
        lines.append(f"| {r['method']} | {r['words']} | {r['delay_median_s']:.2f} | {r['delay_p90_s']:.2f} | "
                     f"{r['delay_max_s']:.2f} | {r['wer_stream']:.2f} | {r['wer_offline']:.2f} |")
    return "\n".join(lines) + "\n"
