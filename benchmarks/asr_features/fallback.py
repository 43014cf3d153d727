"""Issue 47, Whisper's temperature fallback: what it changes in WER and time, ours against faster-whisper's.

Whisper base, greedy, both splits of `mmaccel bench asr` (in domain: 18 real clips + 60 held-out TTS utterances;
out of domain: 48 licence sentences in unseen voices, half under noise); our pipeline at batch 8, faster-whisper's
`WhisperModel` (int8, the fallback it runs per window) utterance by utterance; each with the fallback off (one
temperature, no window left empty) and on (the defaults: temperatures 0, 0.2, ... 1.0, best of 5, thresholds
2.4 / -1 / 0.6). Plain transcripts (no timestamps), no conditioning on earlier text.

Usage: .venv/bin/python benchmarks/asr_features/fallback.py --out benchmarks/asr_features/fallback.json (~25 min)
"""

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))          # this checkout's mmaccel

from mmaccel.bench.asr_suite import FULL_TTS, OOD_UTTERANCES, load_corpus  # noqa: E402
from mmaccel.bench.harness import device_name  # noqa: E402
from mmaccel.metrics.wer import corpus_wer, normalizer_version  # noqa: E402

OFF = dict(temperature=0.0, no_speech_threshold=None)
SPLITS = {"in-domain": FULL_TTS, "ood": OOD_UTTERANCES}


def ours(corpora: dict) -> list[dict]:
    from mmaccel.speech.pipeline import ASRPipeline

    asr = ASRPipeline.from_pretrained("builtin:base")
    asr.transcribe(corpora["in-domain"][0][1], "greedy")                     # warm-up
    rows = []
    for split, corpus in corpora.items():
        audios, refs = [a for _, a, _ in corpus], [t for _, _, t in corpus]
        for fallback in (False, True):
            out = asr.transcribe(audios, "greedy", batch_size=8, **({} if fallback else OFF))
            resampled = [i for i, t in zip(corpus, out.transcripts) if any(s.temperature for s in t.segments)]
            emptied = [i for i, t in zip(corpus, out.transcripts) if not t.text]
            rows.append(row("ours-fp32", split, fallback, refs, out.texts, out.wall_s, [i for i, _, _ in corpus],
                            resampled=[i for i, _, _ in resampled], empty=[i for i, _, _ in emptied],
                            fallback_s=round(out.stats.time_s.get("fallback", 0.0), 1)))
    return rows


def faster_whisper(corpora: dict) -> list[dict]:
    import torch
    from faster_whisper import WhisperModel

    from mmaccel.speech.whisper import ct2_model_dir

    model = WhisperModel(str(ct2_model_dir("base")), device="cpu", compute_type="int8",
                         cpu_threads=torch.get_num_threads())
    common = dict(language="en", beam_size=1, without_timestamps=True, condition_on_previous_text=False)
    rows = []
    for split, corpus in corpora.items():
        refs = [t for _, _, t in corpus]
        for fallback in (False, True):
            texts, resampled, t0 = [], [], time.perf_counter()
            for i, audio, _ in corpus:
                segments = list(model.transcribe(audio.samples, **common, **({} if fallback else OFF))[0])
                texts.append(" ".join(s.text.strip() for s in segments).strip())
                if any(s.temperature for s in segments):
                    resampled.append(i)
            rows.append(row("faster-whisper-int8", split, fallback, refs, texts, time.perf_counter() - t0,
                            [i for i, _, _ in corpus], resampled=resampled,
                            empty=[i for (i, _, _), t in zip(corpus, texts) if not t]))
    return rows


def row(tool: str, split: str, fallback: bool, refs: list[str], texts: list[str], seconds: float, ids: list[str],
        **extra) -> dict:
    out = {"tool": tool, "split": split, "fallback": fallback, "wer": round(100 * corpus_wer(refs, texts).wer, 2),
           "seconds": round(seconds, 1), **extra, "texts": dict(zip(ids, texts))}
    print({k: v for k, v in out.items() if k != "texts"}, flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    corpora = {split: load_corpus(n, split) for split, n in SPLITS.items()}
    rows = ours(corpora) + faster_whisper(corpora)      # torch first: a loaded CTranslate2 model slows its products
    for r in rows:
        off = next(o for o in rows if o["tool"] == r["tool"] and o["split"] == r["split"] and not o["fallback"])
        r["changed_transcripts"] = sorted(i for i, t in r["texts"].items() if t != off["texts"][i])
    for r in rows:
        del r["texts"]
    doc = {"command": "python benchmarks/asr_features/fallback.py --out benchmarks/asr_features/fallback.json",
           "device": device_name(), "model": "builtin:base", "method": "greedy", "batch": {"ours": 8, "faster-whisper": 1},
           "audio": {s: f"{len(c)} utterances, {sum(a.duration for _, a, _ in c):.1f} s" for s, c in corpora.items()},
           "wer": f"corpus WER, {normalizer_version()}", "grouped": "a window's samples share its keys/values",
           "results": rows}
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
