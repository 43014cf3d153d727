"""How the order of utterances into batches of 8 changes greedy and speculative decoding of Whisper
base: the benchmark's corpus order (mixed lengths) against longest first (what `transcribe` does
with a list), each method on the same batches in one process, two rounds.

    python benchmarks/ceiling/asr_batch_order.py > benchmarks/ceiling/asr_batch_order.json
"""

from __future__ import annotations

import json
import sys

import torch

from mmaccel.bench.asr_suite import load_corpus
from mmaccel.bench.harness import device_name
from mmaccel.speech.pipeline import ASRPipeline

METHODS = [("greedy", {}), ("speculative", {"k": 4}), ("speculative", {"k": 4, "stop_below": 0.8})]


def run(asr: ASRPipeline, batches: list[list], method: str, params: dict) -> tuple[float, int, list[str]]:
    """Decoding seconds, target passes and transcripts over `batches` (one transcribe call each)."""
    seconds, passes, texts = 0.0, 0, []
    for batch in batches:
        out = asr.transcribe(batch, method, batch_size=len(batch), **params)
        seconds += out.stats.time_s["decode"]
        passes += out.stats.nfe
        texts += out.texts
    return seconds, passes, texts


def main() -> None:
    torch.set_num_threads(2)
    asr = ASRPipeline.from_pretrained("builtin:base")
    audio = [a for _, a, _ in load_corpus(60)]
    orders = {"corpus": audio, "longest_first": sorted(audio, key=lambda a: -a.duration)}
    asr.transcribe(audio[:1], "speculative", k=2)                                   # warm-up
    rows = []
    for round_ in range(2):
        for order, items in orders.items():
            batches = [items[i : i + 8] for i in range(0, len(items), 8)]
            greedy = run(asr, batches, "greedy", {})
            greedy_s, greedy_texts = greedy[0], greedy[2]
            for method, params in METHODS:
                s, passes, texts = greedy if method == "greedy" else run(asr, batches, method, params)
                rows.append({"round": round_, "order": order, "method": method, "params": params, "decode_s": round(s, 3),
                             "passes": passes, "decoder_speedup": round(greedy_s / s, 3),
                             "identical_to_greedy": texts == greedy_texts})
                print(rows[-1], file=sys.stderr, flush=True)
    print(json.dumps({"command": "python benchmarks/ceiling/asr_batch_order.py", "batch": 8, "device": device_name(),
                      "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
