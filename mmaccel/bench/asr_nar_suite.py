"""`mmaccel bench asr-nar`: Whisfusion's parallel decoding against Whisper's own greedy decoder.

Both read the same encoder states (the Whisfusion decoder is trained on the frozen encoder of the
Whisper it starts from, `builtin:tiny.en` for the built-in one), so the rows compare decoders only;
features and encoder time are in every row's latency alike.

Audio, two sets, each in set-homogeneous batches of 1 and 8:
- `short`: the 18 real clips (LibriVox, cards, ALSA) and the first `tts_utterances` held-out TTS
  utterances (held-out sentences and voices): the ASR benchmark's set.
- `long`: `long_clips` clips of 20-30 s, each the next held-out TTS utterances joined with 0.3 s of
  silence (no utterance of the short set).
With `split="ood"` both come from the out-of-domain utterances (`load_corpus`): the first half short,
the second half joined into long clips.

Rows: Whisper greedy (the baseline, one pass a token) and Whisfusion at several (candidates K,
steps S, selection) settings, all reported on these held-out sets (a sweep, nothing is picked on
them). Each row: corpus WER on each set, decoder passes, latency and speed-up per set.
"""

from __future__ import annotations

import numpy as np
import torch

from mmaccel.bench.harness import MethodSpec, Suite
from mmaccel.core.stats import DecodeStats
from mmaccel.errors import check
from mmaccel.metrics.wer import corpus_wer, normalizer_version
from mmaccel.speech.audio import Audio

DEFAULT_METHODS = [
    MethodSpec("greedy"),
    MethodSpec("whisfusion", {"candidates": 1, "steps": 4, "select": "confidence"}, label="whisfusion-k1-s4"),
    MethodSpec("whisfusion", {"candidates": 4, "steps": 4, "select": "rover"}, label="whisfusion-k4-s4-rover"),
    MethodSpec("whisfusion", {"candidates": 8, "steps": 4, "select": "confidence"}, label="whisfusion-k8-s4-conf"),
    MethodSpec("whisfusion", {"candidates": 8, "steps": 4, "select": "rover"}, label="whisfusion-k8-s4-rover"),
    MethodSpec("whisfusion", {"candidates": 8, "steps": 8, "select": "rover"}, label="whisfusion-k8-s8-rover"),
]
FULL_TTS, QUICK_TTS = 100, 4
FULL_LONG, QUICK_LONG = 16, 2
SETS = ("short", "long")


def long_clips(utterances: list[tuple[str, Audio, str]], count: int, low: float = 20.0, high: float = 30.0,
               gap_s: float = 0.3) -> list[tuple[str, Audio, str]]:
    """`count` clips of `low`..`high` seconds, each the next utterances joined with `gap_s` of silence."""
    gap = np.zeros(int(gap_s * 16000), dtype=np.float32)
    out, parts = [], []
    for item in utterances:
        seconds = sum(a.duration for _, a, _ in parts) + gap_s * len(parts)
        if parts and seconds + gap_s + item[1].duration > high:
            if seconds >= low:
                out.append(_join(parts, gap))
                if len(out) == count:
                    return out
            parts = []
        parts.append(item)
    check(False, f"only {len(out)} long clips of {low:.0f}-{high:.0f} s could be built from {len(utterances)} "
          f"utterances; {count} were asked for")


def _join(parts, gap) -> tuple[str, Audio, str]:
    samples = np.concatenate([p for i, (_, a, _) in enumerate(parts) for p in ((gap, a.samples) if i else (a.samples,))])
    return "+".join(i for i, _, _ in parts), Audio(samples.astype(np.float32)), " ".join(t for _, _, t in parts)


def build_asr_nar_suite(quick: bool = False, methods: list[MethodSpec] | None = None,
                        model: str = "builtin:whisfusion-tiny.en", tts_utterances: int | None = None,
                        long_count: int | None = None, pipeline=None, split: str = "in-domain") -> Suite:
    from mmaccel.bench.asr_suite import OOD_UTTERANCES, load_corpus
    from mmaccel.speech.pipeline import ASRPipeline
    from mmaccel.speech.whisfusion.methods import build_whisfusion_method
    from mmaccel.speech.whisfusion.pipeline import WhisfusionPipeline

    methods = methods or DEFAULT_METHODS
    if methods[0].name != "greedy":
        methods = [MethodSpec("greedy")] + [m for m in methods if m.name not in ("greedy", "ar")]
    for m in methods[1:]:            # checked, parameters too, before anything loads
        check(m.name in WhisfusionPipeline.methods(), f"unknown method {m.name!r} for bench asr-nar; choose greedy or "
              f"{', '.join(WhisfusionPipeline.methods())}")
        build_whisfusion_method(m.name, **m.params)
    fusion = pipeline or WhisfusionPipeline.from_pretrained(model)
    ar = ASRPipeline(fusion.bundle)                              # the same Whisper: the same encoder states
    tts = tts_utterances if tts_utterances is not None else (QUICK_TTS if quick else FULL_TTS)
    count = long_count if long_count is not None else (QUICK_LONG if quick else FULL_LONG)
    if split == "in-domain":
        everything = load_corpus(tts + 12 * count)
        real = len(everything) - tts - 12 * count
        short, rest = everything[:real + tts], everything[real + tts:]
    else:                           # the out-of-domain utterances: the first half short, the rest joined
        everything = load_corpus(OOD_UTTERANCES, split)
        real, half = 0, len(everything) // 2
        short, rest = everything[:min(tts, half)], everything[half:]
        count = min(count, int(sum(a.duration for _, a, _ in rest) // 30))
    sets = {"short": short, "long": long_clips(rest, count)}
    corpus = sets["short"] + sets["long"]
    refs = [t for _, _, t in corpus]
    kind = ["short"] * len(sets["short"]) + ["long"] * len(sets["long"])
    batches = {b: [(name, items[i:i + b]) for name, items in sets.items() for i in range(0, len(items), b)]
               for b in (1, 8)}

    def run_batch(spec: MethodSpec, batch, seed: int) -> tuple[list, DecodeStats]:
        name, items = batch
        audios = [a for _, a, _ in items]
        if spec.name == "greedy":
            out = ar.transcribe(audios, "greedy", batch_size=len(audios))
        else:
            out = fusion.transcribe(audios, spec.name, batch_size=len(audios), seed=seed, **spec.params)
        stats = out.stats
        stats.time_s["total"] = out.wall_s
        stats.time_s[name] = out.wall_s
        return out.texts, stats

    def quality(spec: MethodSpec, outputs: list, baseline: list) -> dict:
        row = {"wer": round(100 * corpus_wer(refs, outputs).wer, 2)}
        for name in SETS:
            idx = [i for i, k in enumerate(kind) if k == name]
            row[f"wer_{name}"] = round(100 * corpus_wer([refs[i] for i in idx], [outputs[i] for i in idx]).wer, 2)
        return row

    def finish(doc: dict) -> None:
        base = {r["batch"]: r for r in doc["results"] if r["method"] == "greedy"}
        for r in doc["results"]:
            for name in SETS:
                mine, theirs = r["time_s"].get(name), base[r["batch"]]["time_s"].get(name)
                if mine and theirs:
                    r["quality"][f"speedup_{name}"] = round(theirs / mine, 3)
                    r["quality"][f"rtfx_{name}"] = round(sum(a.duration for _, a, _ in sets[name]) / mine, 2)

    config = {"model": model, "whisper": fusion.bundle.name, "split": split,
              "audio": {"short": f"{real} real clips + {len(short) - real} held-out TTS utterances" if split == "in-domain"
                        else f"{len(short)} out-of-domain utterances (licence sentences, unseen voices, half under noise)",
                        "long": f"{len(sets['long'])} clips of 20-30 s joined from the next held-out utterances"},
              "audio_s": {name: round(sum(a.duration for _, a, _ in items), 1) for name, items in sets.items()},
              "batch_sizes": [1, 8], "wer": f"corpus WER, {normalizer_version()}",
              "settings": "a sweep reported on the held-out sets; nothing is picked on them",
              "threads": torch.get_num_threads(), "quick": quick}
    return Suite("asr-nar", config, methods, batches, run_batch, quality, lambda spec: spec.name == "greedy",
                 verify_identical=False, primary_quality="wer", warmup=lambda spec: run_batch(spec, ("short", short[:1]), 0),
                 finish=finish)
