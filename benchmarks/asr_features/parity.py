"""Issue 47 item 5, parity: our greedy word timestamps against faster-whisper's on the same weights and audio.

Whisper base, the real clips and the first 60 held-out TTS utterances (in domain; `--split ood`: the first 60
out-of-domain ones), `word_timestamps=True`, English, greedy, no VAD. faster-whisper decodes each utterance with
its `WhisperModel` (float32 and int8; beam 1, temperature 0, not conditioned on previous text). Where the words
agree, |delta| of every word's start and end (median, 90th percentile); where they differ, both transcripts.

Usage: .venv/bin/python benchmarks/asr_features/parity.py [--split ood] --out benchmarks/asr_features/parity.json
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))          # this checkout's mmaccel

from mmaccel.bench.asr_suite import load_corpus  # noqa: E402
from mmaccel.bench.harness import device_name  # noqa: E402
from mmaccel.speech.pipeline import ASRPipeline  # noqa: E402
from mmaccel.speech.whisper import ct2_model_dir  # noqa: E402

TTS_UTTERANCES = 60


def compare(ours: list[list[tuple[str, float, float]]], theirs: list[list[tuple[str, float, float]]],
            ids: list[str]) -> dict:
    """Words (text, start, end) per utterance, ours and the peer's -> agreement and time deltas."""
    deltas, mismatches = [], []
    for uid, mine, peer in zip(ids, ours, theirs):
        if [w for w, _, _ in mine] != [w for w, _, _ in peer]:
            mismatches.append({"id": uid, "ours": "".join(w for w, _, _ in mine).strip(),
                               "faster_whisper": "".join(w for w, _, _ in peer).strip()})
            continue
        deltas += [abs(a[1] - b[1]) for a, b in zip(mine, peer)] + [abs(a[2] - b[2]) for a, b in zip(mine, peer)]
    d = np.array(deltas) if deltas else np.zeros(1)
    return {"utterances": len(ids), "same_words": len(ids) - len(mismatches), "word_times": len(deltas),
            "median_abs_delta_s": round(float(np.median(d)), 3), "p90_abs_delta_s": round(float(np.percentile(d, 90)), 3),
            "max_abs_delta_s": round(float(d.max()), 3), "mismatches": mismatches}


def main() -> None:
    import faster_whisper
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", default="in-domain", choices=("in-domain", "ood"))
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    corpus = load_corpus(TTS_UTTERANCES, args.split)
    ids, audios = [i for i, _, _ in corpus], [a for _, a, _ in corpus]
    asr = ASRPipeline.from_pretrained("builtin:base")
    out = asr.transcribe(audios, "greedy", batch_size=8, word_timestamps=True, temperature=0.0)   # as the peer's below
    ours = [[(w.word, w.start, w.end) for s in t.segments for w in s.words] for t in out.transcripts]
    del asr                                      # CTranslate2 and torch do not share the process well
    results = {}
    for compute_type in ("float32", "int8"):
        peer = faster_whisper.WhisperModel(str(ct2_model_dir("base")), device="cpu", compute_type=compute_type,
                                           cpu_threads=torch.get_num_threads())
        theirs = []
        for audio in audios:
            segments, _ = peer.transcribe(audio.samples, language="en", word_timestamps=True, beam_size=1,
                                          temperature=0.0, condition_on_previous_text=False)
            theirs.append([(w.word, w.start, w.end) for s in segments for w in s.words])
        results[compute_type] = compare(ours, theirs, ids)
        print(compute_type, {k: v for k, v in results[compute_type].items() if k != "mismatches"}, flush=True)
    doc = {"command": "python benchmarks/asr_features/parity.py" + (" --split ood" if args.split == "ood" else ""),
           "device": device_name(), "model": "builtin:base", "split": args.split,
           "audio": f"{len(corpus)} utterances", "faster_whisper": faster_whisper.__version__, "results": results}
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
