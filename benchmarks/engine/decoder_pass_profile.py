"""Issue 68 item 3: where one decoder pass of Whisper base's int8 target spends its time on this CPU.

The pass as greedy-verified decoding runs it at precision "auto" on the host (int8 linear layers, attention in one
kernel shape, the full logits under the timestamp rules: `ASRPipeline.model`), from a state holding the prompt and
filler text up to 32 cache entries (`mmaccel.speech.pass_shape.filled_state`), at batch 1 and 8 and widths 1 and 8
(a one-token pass, a verify pass of 7 drafts). Each pass is timed (median of 31) and then profiled over 31 more with
`torch.profiler`, its parts labelled by wrapping, in this script only, the functions that run them:

- `linear products`: the decoder layers' `Int8Linear` calls (their per-token scaling included);
- `vocabulary projection`: `WhisperDecoderModel._project` (51 865 x 512, int8);
- `self-attention`, `cross-attention`: the attention calls (`fixed_shape_attention`; cross: `_cross_attention`);
- `timestamp rules`: `rule_logits` (every pass in timestamp mode);
- `rest`: the pass's time outside those (embedding, layer norms, GELU, residual adds, the cache writes, Python).

Beside each part: its bytes against this machine's read bandwidth where that is its floor (`mmaccel bench floor`'s
machine probe, same run). Writes benchmarks/engine/decoder_pass_profile.json and .md.

    flock /tmp/mmaccel-bench.lock .venv/bin/python benchmarks/engine/decoder_pass_profile.py
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

import mmaccel.speech.decoder as decoder_module
from mmaccel.engine.int8 import Int8Linear
from mmaccel.engine.machine import measure_machine
from mmaccel.engine.measured import time_ms
from mmaccel.speech.pass_shape import filled_state, filler
from mmaccel.speech.pipeline import ASRPipeline
from mmaccel.speech.timestamps import TimestampRules

PARTS = ("linear products", "vocabulary projection", "self-attention", "cross-attention", "timestamp rules")
REPEATS = 31
COMMAND = "flock /tmp/mmaccel-bench.lock .venv/bin/python benchmarks/engine/decoder_pass_profile.py"


def labelled(name: str, fn):
    def run(*args, **kwargs):
        with record_function(name):
            return fn(*args, **kwargs)
    return run


def label_parts() -> None:
    """Wrap the functions of each part in a profiler range (before the pipeline binds them)."""
    Int8Linear.forward = labelled("int8 linear", Int8Linear.forward)
    model = decoder_module.WhisperDecoderModel
    model._project = labelled("vocabulary projection", model._project)
    decoder_module._cross_attention = labelled("cross-attention", decoder_module._cross_attention)
    decoder_module.rule_logits = labelled("timestamp rules", decoder_module.rule_logits)
    decoder_module.fixed_shape_attention = labelled("attention", decoder_module.fixed_shape_attention)


def part_ms(prof, passes: int) -> dict[str, float]:
    """Milliseconds per pass of each labelled range (inclusive CPU time), nested ranges separated."""
    total = {e.key: e.cpu_time_total / 1e3 / passes for e in prof.key_averages() if e.key in (
        "int8 linear", "vocabulary projection", "cross-attention", "timestamp rules", "attention", "pass")}
    got = {k: total.get(k, 0.0) for k in ("int8 linear", "vocabulary projection", "cross-attention",
                                          "timestamp rules", "attention", "pass")}
    # the projection is an Int8Linear too, and cross-attention calls the attention kernel
    return {"linear products": got["int8 linear"] - got["vocabulary projection"],
            "vocabulary projection": got["vocabulary projection"],
            "self-attention": got["attention"] - got["cross-attention"],
            "cross-attention": got["cross-attention"],
            "timestamp rules": got["timestamp rules"],
            "profiled pass": got["pass"]}


def main(out: Path) -> None:
    torch.set_num_threads(2)
    label_parts()
    machine = measure_machine()
    pipe = ASRPipeline.from_pretrained("builtin:base", precision="auto", draft=None)
    model = pipe.model
    prompt = pipe.bundle.prompt("en", "transcribe", True)
    tokens = pipe.bundle.tokens
    rules = TimestampRules(tokens.no_timestamps, tokens.end_of_text, len(prompt))
    cfg = model.hf.config
    # the weights a pass reads (the cross-attention key/value projections ran once, at the prefill)
    weights = sum(m.weight.numel() for layer in model.decoder.layers for m in (
        layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, layer.self_attn.out_proj,
        layer.encoder_attn.q_proj, layer.encoder_attn.out_proj, layer.fc1, layer.fc2))
    vocab = model.decoder.embed_tokens.weight.numel()
    rows_out = []
    for rows in (1, 8):
        state = filled_state(model, prompt, rows, rules=rules, room=64)
        for width in (1, 8):
            feed = torch.full((rows, width), filler(model))

            def run(feed=feed, width=width, state=state):
                model.step(state, feed)
                state.rollback(width)
            with torch.inference_mode():
                median, best = time_ms(run, REPEATS)
                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    for _ in range(REPEATS):
                        with record_function("pass"):
                            run()
            parts = part_ms(prof, REPEATS)
            profiled = parts.pop("profiled pass")
            share = median / profiled if profiled else 1.0         # the profiler's own overhead, scaled out
            ms = {k: round(v * share, 3) for k, v in parts.items()}
            ms["rest"] = round(median - sum(ms.values()), 3)
            cross_bytes = 2 * cfg.decoder_layers * rows * cfg.max_source_positions * cfg.d_model * 4
            floors = {"linear products": weights / machine.read_gb_s / 1e6,       # int8: a byte a weight
                      "vocabulary projection": vocab / machine.read_gb_s / 1e6,
                      "cross-attention": cross_bytes / machine.read_gb_s / 1e6}
            rows_out.append({"rows": rows, "width": width, "ms": round(median, 3), "best_ms": round(best, 3),
                             "parts_ms": ms, "floor_ms": {k: round(v, 3) for k, v in floors.items()},
                             "profiler_overhead": round(profiled / median, 3)})
            print(json.dumps(rows_out[-1]), flush=True)
    doc = {"suite": "decoder_pass_profile", "machine": machine.to_dict(), "torch": torch.__version__,
           "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "precision": pipe.precision_reason,
           "model": "whisper-base", "kv_len": 32, "command": COMMAND, "results": rows_out}
    out.write_text(json.dumps(doc, indent=1) + "\n")
    m = doc["machine"]
    lines = [f"{m['cpu']} ({', '.join(m['flags'])}; {m['threads']} threads; reads {m['read_gb_s']:.1f} GB/s), "
             f"{doc['date']}; {doc['precision']}; `{COMMAND}`", "",
             f"Milliseconds of one pass (median and best of {REPEATS}) and of its parts (their profiled means, scaled to "
             "the median; the floor of the part's bytes at this machine's read bandwidth in brackets).", "",
             "| batch | width | pass ms (best) | " + " | ".join(PARTS) + " | rest |", "|---|---|---|" + "---|" * 6]
    for r in rows_out:
        cells = [f"{r['parts_ms'][p]:.2f}" + (f" ({r['floor_ms'][p]:.2f})" if p in r["floor_ms"] else "")
                 for p in PARTS]
        lines.append(f"| {r['rows']} | {r['width']} | {r['ms']:.2f} ({r['best_ms']:.2f}) | " + " | ".join(cells)
                     + f" | {r['parts_ms']['rest']:.2f} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out} and {out.with_suffix('.md')}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("decoder_pass_profile.json"))
