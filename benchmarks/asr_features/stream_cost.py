"""Issue 47 item 4: what one decode of a live stream costs, by phase — the unit of its words' emission delay.

A stream (`ASRPipeline.stream`) decodes its buffer (at most `trim_s`, 15 s) with word times each time a second of
audio has arrived; a word is committed when two decodes agree on it. This times `transcribe` as the stream calls it
(batch 1, word timestamps, the temperature fallback's defaults) on buffers of 3 to 15 s cut from the streaming
benchmark's audio (the real clips joined), greedy; median of 3 runs per length, after a warm-up.

Usage: .venv/bin/python benchmarks/asr_features/stream_cost.py --out benchmarks/asr_features/stream_cost.json
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))          # this checkout's mmaccel

LENGTHS_S = (3, 6, 10, 15)
START_S = 20
RUNS = 3
PHASES = ("encoder", "decode", "scores", "words")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out")
    args = parser.parse_args()
    import torch

    from mmaccel.bench.harness import device_name
    from mmaccel.bench.stream_suite import stream_corpus
    from mmaccel.speech.audio import SAMPLE_RATE, Audio
    from mmaccel.speech.pipeline import ASRPipeline

    samples, _ = stream_corpus(False)
    asr = ASRPipeline.from_pretrained("builtin:base")
    asr.transcribe(Audio(samples[: 5 * SAMPLE_RATE]), "greedy", batch_size=1, word_timestamps=True)     # warm-up
    rows = []
    for length in LENGTHS_S:
        buffer = Audio(samples[START_S * SAMPLE_RATE : (START_S + length) * SAMPLE_RATE], "stream")
        runs = []
        for _ in range(RUNS):
            t0 = time.perf_counter()
            out = asr.transcribe(buffer, "greedy", batch_size=1, language="en", word_timestamps=True)
            runs.append({"wall_s": time.perf_counter() - t0, "tokens": len(out.transcripts[0].tokens),
                         **{p: out.stats.time_s.get(p, 0.0) for p in PHASES}})
        row = {"buffer_s": length, "tokens": runs[0]["tokens"]}
        row.update({k: round(statistics.median(r[k] for r in runs), 3) for k in ("wall_s", *PHASES)})
        rows.append(row)
        print(row, flush=True)
    doc = {"command": "python benchmarks/asr_features/stream_cost.py", "device": device_name(),
           "threads": torch.get_num_threads(), "model": "builtin:base", "method": "greedy", "runs": RUNS,
           "results": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
