"""Issue 68 item 2: does adaptive drafting gain from the engine's measured pass cost by width (the prior)?

One process, Whisper base at precision "auto", word timestamps and VAD on, the in-domain words+VAD set of `bench
asr`: each method at batch 1 and 8 transcribed with the pipeline's adaptive drafting as shipped (the prior:
`ASRPipeline.pass_costs`) and with the chooser that only learns from its own passes (no prior), each from a fresh
chooser, after one untimed call (a method's first call pays its setup), in the order A B B A so that drift cancels;
wall seconds of the whole transcribe calls (VAD, encoder, decoding, words). Tokens are greedy's either way
(checked). Writes benchmarks/asr_adaptive/prior_ab.json.

    flock /tmp/mmaccel-bench.lock .venv/bin/python benchmarks/asr_adaptive/prior_ab.py
"""

from __future__ import annotations

import datetime as dt
import json
import sys
import time
from pathlib import Path

import torch

from mmaccel.bench.asr_suite import AS_FASTER_WHISPER, FULL_TTS, load_corpus
from mmaccel.core.adaptive import AdaptiveDrafting
from mmaccel.engine.machine import measure_machine
from mmaccel.speech.pipeline import ASRPipeline

METHODS = {"eagle-k4": ("eagle", {"k": 4, "stop_below": 0.0}), "speculative-k4": ("speculative", {"k": 4})}
FEATURES = {"timestamps": True, "word_timestamps": True, "vad_filter": True}


def main(out: Path) -> None:
    torch.set_num_threads(2)
    pipe = ASRPipeline.from_pretrained("builtin:base", precision="auto")
    corpus = load_corpus(FULL_TTS)
    audios = [a for _, a, _ in corpus]
    audio_s = sum(a.duration for a in audios)
    shipped = pipe._adaptive

    def run(method: str, params: dict, batch: int, prior: bool) -> tuple[float, list[str], int]:
        pipe._adaptive = shipped if prior else {t: AdaptiveDrafting() for t in (False, True)}
        for chooser in pipe._adaptive.values():              # a fresh chooser: what it learns is part of the cost
            chooser.costs.clear()
            chooser.pooled.clear()
        texts, passes, t0 = [], 0, time.perf_counter()
        for i in range(0, len(audios), batch):
            got = pipe.transcribe(audios[i : i + batch], method, batch_size=batch, **FEATURES, **AS_FASTER_WHISPER,
                                  **params)
            texts += got.texts
            passes += got.stats.nfe
        return time.perf_counter() - t0, texts, passes

    pipe.pass_costs(1, True), pipe.pass_costs(8, True)         # measured (or read) once, outside the timing
    rows, greedy = [], {}
    for name, (method, params) in METHODS.items():
        for batch in (1, 8):
            if batch not in greedy:
                greedy[batch] = run("greedy", {}, batch, True)[1]
            run(method, params, batch, True)                   # warm: the first call of a method pays its setup
            seconds = {True: [], False: []}
            passes = {}
            for prior in (True, False, False, True):
                s, texts, nfe = run(method, params, batch, prior)
                assert texts == greedy[batch], f"{name} b{batch}: not greedy's transcripts"
                seconds[prior].append(s)
                passes[prior] = nfe
            with_prior, without = (sum(seconds[p]) / 2 for p in (True, False))
            rows.append({"method": name, "batch": batch, "rtfx_prior": round(audio_s / with_prior, 3),
                         "rtfx_no_prior": round(audio_s / without, 3), "prior_over_none": round(without / with_prior, 4),
                         "passes_prior": passes[True], "passes_no_prior": passes[False],
                         "seconds_prior": [round(s, 2) for s in seconds[True]],
                         "seconds_no_prior": [round(s, 2) for s in seconds[False]]})
            print(json.dumps(rows[-1]), flush=True)
    doc = {"suite": "asr_adaptive_prior", "machine": measure_machine().to_dict(), "torch": torch.__version__,
           "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "audio_s": round(audio_s, 1),
           "utterances": len(audios), "precision": pipe.precision_reason,
           "command": "flock /tmp/mmaccel-bench.lock .venv/bin/python benchmarks/asr_adaptive/prior_ab.py",
           "results": rows}
    out.write_text(json.dumps(doc, indent=1) + "\n")
    lines = [f"{doc['machine']['cpu']} ({', '.join(doc['machine']['flags'])}; 2 threads), {doc['date']}; "
             f"{doc['utterances']} utterances, {doc['audio_s']} s; {doc['precision']}; `{doc['command']}`", "",
             "| method | batch | RTFx, prior | RTFx, no prior | prior / none | passes, prior | passes, no prior |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['method']} | {r['batch']} | {r['rtfx_prior']:.2f} | {r['rtfx_no_prior']:.2f} | "
              f"{r['prior_over_none']:.3f} | {r['passes_prior']} | {r['passes_no_prior']} |" for r in rows]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("prior_ab.json"))
