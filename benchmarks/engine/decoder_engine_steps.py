"""Issue 68 item 2: the int8 target's decoding pass as the pipeline runs it, compiled (`decoder_graph`, the default
of `ASRPipeline(precision="auto" | "int8")` with OpenVINO) against eager (`model.eager()`), through `model.step` on a
state holding the prompt and filler text up to 32 entries: batch 1 and 8, one token and eight (median and best of
`REPEATS`, one process, the two engines interleaved per shape).

    flock /tmp/mmaccel-bench.lock .venv/bin/python benchmarks/engine/decoder_engine_steps.py
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from functools import partial
from pathlib import Path

import torch

from mmaccel.engine.machine import measure_machine
from mmaccel.engine.measured import time_ms
from mmaccel.speech.pass_shape import filled_state, filler_pass
from mmaccel.speech.pipeline import ASRPipeline

REPEATS = 21
KV_LEN = 32
COMMAND = "flock /tmp/mmaccel-bench.lock .venv/bin/python benchmarks/engine/decoder_engine_steps.py"


def main(out: Path) -> None:
    torch.set_num_threads(2)
    machine = measure_machine()
    pipe = ASRPipeline.from_pretrained("builtin:base", precision="auto", draft=None)
    compiled = pipe.model
    assert compiled.graph is not None, "the compiled pass did not build (OpenVINO missing?)"
    engines = {"compiled (OpenVINO, stateful)": compiled, "eager int8": compiled.eager()}
    prompt = pipe.bundle.prompt("en", "transcribe", False)
    results = []
    for rows in (1, 8):
        with torch.inference_mode():
            states = {name: filled_state(model, prompt, rows, KV_LEN) for name, model in engines.items()}
        for width in (1, 8):
            for name, model in engines.items():
                with torch.inference_mode():
                    median, best = time_ms(partial(filler_pass, model, states[name], width), REPEATS)
                results.append({"engine": name, "rows": rows, "width": width, "ms": round(median, 2),
                                "best_ms": round(best, 2)})
                print(json.dumps(results[-1]), flush=True)
    doc = {"suite": "decoder_engine_steps", "machine": machine.to_dict(), "torch": torch.__version__,
           "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "model": "whisper-base", "kv_len": KV_LEN,
           "compile_s": compiled.graph.stateful.compile_s, "command": COMMAND, "results": results}
    out.write_text(json.dumps(doc, indent=1) + "\n")
    m = doc["machine"]
    lines = [f"{m['cpu']} ({', '.join(m['flags'])}; {m['threads']} threads; reads {m['read_gb_s']:.1f} GB/s), "
             f"{doc['date']}; `{COMMAND}`", "",
             f"`model.step` of Whisper base's int8 target after {KV_LEN} cache entries, milliseconds (median, best "
             f"of {REPEATS}); the compiled engine runs every pass at one graph shape (8 queries).", "",
             "| engine | batch | tokens | ms (best) |", "|---|---|---|---|"]
    lines += [f"| {r['engine']} | {r['rows']} | {r['width']} | {r['ms']:.2f} ({r['best_ms']:.2f}) |" for r in results]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out} and {out.with_suffix('.md')}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("decoder_engine_steps.json"))
