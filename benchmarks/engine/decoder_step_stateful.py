"""Issue 68 item 2 (compiled steps), second probe: Whisper base's decoder pass as an OpenVINO graph that owns its
self-attention cache, against the eager int8 pass that ships.

The pass is `mmaccel.speech.decoder_graph.DecoderStep` (the pipeline's int8 target; this probe drives it by hand
at 448 slots, under OpenVINO's bf16 hint with fp32 cache buffers: the configuration the pipeline ran before its
graph took f32 activations with int8 products and bf16 caches, `compiled.compile_config(int8_activations=True)`,
which `decoder_engine_steps.py` measures through the pipeline's own `model.step`).
`decoder_step_probe.py` fed the caches to the graph at every call and lost to eager:
converting, transposing and gathering them took most of its time. Here each layer's keys and values are a buffer of
Whisper's 448 positions that the graph keeps as state (OpenVINO's `apply_make_stateful_transformation`: the buffer
an input, the buffer with the new keys scattered in at their slots the output it becomes), the cross-attention
keys/values are bf16 inputs set once per window (`set_input_tensor`), one tensor per layer (a stacked one cost a
gather per layer), and a call passes only the embedded tokens, which slots each query may see and where the new
keys go. A rolled-back draft needs no state change: its slot is hidden by the next call's mask and written over.

Weights int8 (a scale per row; OpenVINO quantises activations per token, the rest bf16 where native) or bf16, at
T = 8 (one graph shape for every pass: the pending token and up to seven drafts) and T = 1, batch 1 and 8, from a
state holding the prompt and filler text up to 32 entries (median and best of `REPEATS`); the eager fp32 and int8
passes of the same state beside them; the logit error at the first position against eager fp32; at T = 8 whether
the first token's logits keep their bits when the other seven positions hold drafts instead of padding.

    flock /tmp/mmaccel-bench.lock .venv/bin/python benchmarks/engine/decoder_step_stateful.py
"""

from __future__ import annotations

import datetime as dt
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmaccel.engine.compiled import int8_weights
from mmaccel.engine.machine import measure_machine
from mmaccel.engine.measured import time_ms
from mmaccel.speech.decoder import WhisperDecoderModel
from mmaccel.speech.decoder_graph import DecoderStep
from mmaccel.speech.pass_shape import filled_state, filler
from mmaccel.speech.pipeline import ASRPipeline

REPEATS = 21
KV_LEN = 32
COMMAND = "flock /tmp/mmaccel-bench.lock .venv/bin/python benchmarks/engine/decoder_step_stateful.py"


def step_inputs(model: WhisperDecoderModel, state, tokens: Tensor) -> tuple[tuple[Tensor, ...], list[Tensor]]:
    """(h, visible, slots, self keys..., self values...) and the cross-attention keys..., values... (bf16) for
    appending `tokens` [B, T] to `state` (every row at one length) of the fp32 model."""
    B, T = tokens.shape
    n, S = int(state.cache.lengths[0]), model.max_positions
    h = F.embedding(tokens, model.decoder.embed_tokens.weight) + model.decoder.embed_positions.weight[n : n + T]
    visible = torch.zeros(B, 1, T, S)
    visible[..., :n] = 1.0
    visible[..., n : n + T] = torch.tril(torch.ones(T, T))
    slots = (torch.arange(T) + n)[None].expand(B, T).contiguous()
    caches = [F.pad(t[:, :, :n], (0, 0, 0, S - n)).contiguous() for t in (*state.cache.k, *state.cache.v)]
    cross = [model._cross(state.extras["inputs"], i) for i in range(model.num_layers)]
    crossed = [t.to(torch.bfloat16).contiguous() for t in [k for k, _ in cross] + [v for _, v in cross]]
    return (h, visible, slots, *caches), crossed


def compiled_step(module: nn.Module, inputs: tuple[Tensor, ...], crossed: list[Tensor], int8: bool):
    """The pass compiled with its self-attention buffers as state (set to `inputs`' buffers) and the cross-attention
    tensors set once; returns (the infer request, the per-call feed, compile seconds)."""
    import openvino as ov
    from openvino._offline_transformations import apply_make_stateful_transformation

    layers = len(crossed) // 2
    with torch.no_grad():
        graph = ov.convert_model(int8_weights(module) if int8 else module, example_input=(*inputs, *crossed))
    names = [port.get_any_name() for port in graph.inputs]
    for i, port in enumerate(graph.outputs):
        port.get_tensor().set_names({f"present{i}"})
    buffers = {names[3 + j]: inputs[3 + j] for j in range(2 * layers)}      # outputs 2...: the new buffers
    apply_make_stateful_transformation(graph, {name: f"present{2 + j}" for j, name in enumerate(buffers)})
    config = {"INFERENCE_PRECISION_HINT": "bf16", "INFERENCE_NUM_THREADS": torch.get_num_threads(),
              "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1}
    if int8:
        config["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = 512
    start = time.perf_counter()
    request = ov.Core().compile_model(graph, "CPU", config).create_infer_request()
    seconds = time.perf_counter() - start
    for variable in request.query_state():        # named after the input it replaced, then its output
        name = next(n for n in buffers if variable.name == f"{n}present{2 + list(buffers).index(n)}")
        variable.state = ov.Tensor(buffers[name].numpy())
    for i, t in enumerate(crossed, start=3):
        tensor = ov.Tensor(ov.Type.bf16, ov.Shape(list(t.shape)))
        np.copyto(tensor.data.view(np.uint16), t.view(torch.int16).numpy().view(np.uint16))
        request.set_input_tensor(i, tensor)
    return request, {i: inputs[i].numpy() for i in range(3)}, seconds


def main(out: Path) -> None:
    torch.set_num_threads(2)
    machine = measure_machine()
    pipe = ASRPipeline.from_pretrained("builtin:base", precision="auto", draft=None)
    hf = pipe.bundle.model
    fp32, int8 = WhisperDecoderModel(hf), pipe.model
    prompt = pipe.bundle.prompt("en", "transcribe", False)
    vocab = fp32.vocab_size
    module = DecoderStep(hf.model.decoder, hf.config.decoder_attention_heads).eval()
    results = []
    with torch.inference_mode():
        states = {rows: filled_state(fp32, prompt, rows, KV_LEN) for rows in (1, 8)}
        eager_states = {rows: filled_state(int8, prompt, rows, KV_LEN) for rows in (1, 8)}
    for weights in ("int8", "bf16"):
        for width in (8, 1):
            for rows in (1, 8):
                drafts = torch.randint(1000, 20000, (rows, width), generator=torch.Generator().manual_seed(0))
                drafts[:, 0] = filler(fp32)
                inputs, crossed = step_inputs(fp32, states[rows], drafts)
                request, feed, compile_s = compiled_step(module, inputs, crossed, weights == "int8")

                def run(request=request, feed=feed):
                    return request.infer(feed, share_inputs=True)[0]
                median, best = time_ms(run, REPEATS)
                got = torch.from_numpy(np.array(run(), copy=True))
                with torch.inference_mode():
                    want = fp32._forward(states[rows], drafts, None, None)
                    states[rows].rollback(width)
                row = {"pass": f"OpenVINO stateful, {weights} weights", "width": width, "rows": rows,
                       "ms": round(median, 3), "best_ms": round(best, 3), "compile_s": round(compile_s, 2),
                       "logit_error": round(float((got[:, 0] - want[:, 0]).norm() / want[:, 0].norm()), 5),
                       "argmax_as_fp32": float((got[:, 0].argmax(-1) == want[:, 0].argmax(-1)).float().mean())}
                if width == 8:                   # the pending token with padding after it instead of drafts
                    padded = dict(feed)
                    padded[0] = feed[0].copy()
                    padded[0][:, 1:] = 0.0
                    alone = np.array(request.infer(padded, share_inputs=True)[0], copy=True)
                    row["same_bits_with_or_without_drafts"] = bool(np.array_equal(alone[:, 0], got[:, 0].numpy()))
                results.append(row)
                print(json.dumps(row), flush=True)
    for name, model, pool in (("eager fp32", fp32, states), ("eager int8 (shipped)", int8, eager_states)):
        for width in (8, 1):
            for rows in (1, 8):
                feed = torch.full((rows, width), filler(fp32))

                def step(model=model, state=pool[rows], feed=feed, width=width):
                    model._forward(state, feed, None, None)
                    state.rollback(width)
                with torch.inference_mode():
                    median, best = time_ms(step, REPEATS)
                results.append({"pass": name, "width": width, "rows": rows, "ms": round(median, 3),
                                "best_ms": round(best, 3)})
                print(json.dumps(results[-1]), flush=True)
    doc = {"suite": "decoder_step_stateful", "machine": machine.to_dict(), "torch": torch.__version__,
           "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "model": "whisper-base", "kv_len": KV_LEN,
           "vocab": vocab, "command": COMMAND, "results": results}
    out.write_text(json.dumps(doc, indent=1) + "\n")
    m = doc["machine"]
    lines = [f"{m['cpu']} ({', '.join(m['flags'])}; {m['threads']} threads; reads {m['read_gb_s']:.1f} GB/s), "
             f"{doc['date']}; `{COMMAND}`", "",
             f"One decoder pass of Whisper base after {KV_LEN} cache entries, milliseconds (median, best of "
             f"{REPEATS}); logit error against eager fp32 (relative L2, first position) and arg-max agreement; at "
             "width 8 whether the first token's logits keep their bits with drafts or padding after it.", "",
             "| pass | width | batch | ms (best) | logit error | arg-max as fp32 | same bits | compile s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        bits = r.get("same_bits_with_or_without_drafts")
        lines.append(f"| {r['pass']} | {r['width']} | {r['rows']} | {r['ms']:.2f} ({r['best_ms']:.2f}) | "
                     f"{r.get('logit_error', '–')} | {r.get('argmax_as_fp32', '–')} | {'–' if bits is None else bits} "
                     f"| {r.get('compile_s', '–')} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out} and {out.with_suffix('.md')}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("decoder_step_stateful.json"))
