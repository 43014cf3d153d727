"""Issue 68 item 2 (compiled steps): what Whisper base's decoder pass costs compiled by OpenVINO, against the eager
int8 pass that ships, and whether a compiled pass keeps a token's logits bitwise the same at every width.

The pass is written as a function of tensors (`StepGraph`): the embedded tokens [B, T, d], which cache slots and new
positions each query may see [B, 1, T, S + T] (1 or 0), the self-attention cache [B, L, H, S, Dh] (S = Whisper's 448
positions, the slots a query may not see masked) and the cross-attention keys/values [B, L, H, 1500, Dh] -> the
logits and the new keys/values, one tensor. It is exported once per precision through
`mmaccel.engine.compiled.compile_module` (fp32, bf16 and int8: int8 weights with a scale per row, activations
quantised per token by OpenVINO, the rest bf16 where native) at T = 8 (a one-token pass padded to a verify pass of 7
drafts: one graph shape for every pass, as the eager int8 target's attention runs) and at T = 1, and timed at batch
1 and 8 from a state holding the prompt and filler text up to 32 entries (median and best of `REPEATS`). Beside
each: the eager passes of the same state (fp32, and the int8 fixed-shape target `ASRPipeline(precision="auto")`
runs), the relative error of the logits against eager fp32, whether the arg-max is fp32's, and, at T = 8, whether a
token's logits are bitwise the same when the other seven positions hold drafts instead of padding (what
greedy-identity by construction needs).

    flock /tmp/mmaccel-bench.lock .venv/bin/python benchmarks/engine/decoder_step_probe.py
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmaccel.engine.compiled import compile_module, export_graph, int8_weights
from mmaccel.engine.machine import measure_machine
from mmaccel.engine.measured import time_ms
from mmaccel.speech.decoder import WhisperDecoderModel
from mmaccel.speech.pass_shape import filled_state, filler
from mmaccel.speech.pipeline import ASRPipeline

REPEATS = 21
KV_LEN = 32
COMMAND = "flock /tmp/mmaccel-bench.lock .venv/bin/python benchmarks/engine/decoder_step_probe.py"


class StepGraph(nn.Module):
    """One Whisper decoder pass as a function of tensors (see the module doc): h [B, T, d], visible [B, 1, T, S + T],
    self_k / self_v [B, L, H, S, Dh], cross_k / cross_v [B, L, H, F, Dh] -> [B, T, V + 2 L d] (the logits, then
    each layer's new keys and values)."""

    def __init__(self, hf):
        super().__init__()
        decoder = hf.model.decoder
        self.layers, self.norm = decoder.layers, decoder.layer_norm
        d, vocab = decoder.embed_tokens.weight.shape[1], decoder.embed_tokens.weight.shape[0]
        self.project = nn.Linear(d, vocab, bias=False)
        self.project.weight = decoder.embed_tokens.weight
        self.num_heads = hf.config.decoder_attention_heads

    def forward(self, h: Tensor, visible: Tensor, self_k: Tensor, self_v: Tensor, cross_k: Tensor,
                cross_v: Tensor) -> Tensor:
        B, T, d = h.shape
        H = self.num_heads
        mask = torch.zeros_like(visible).masked_fill(visible < 0.5, float("-inf"))     # 1: may attend

        def heads(t: Tensor) -> Tensor:
            return t.view(B, T, H, d // H).transpose(1, 2)

        def merge(t: Tensor) -> Tensor:
            return t.transpose(1, 2).reshape(B, T, d)
        new = []
        for i, layer in enumerate(self.layers):
            a, c = layer.self_attn, layer.encoder_attn
            x = layer.self_attn_layer_norm(h)
            q, k, v = heads(a.q_proj(x)), a.k_proj(x), a.v_proj(x)
            new += [k, v]
            keys, values = torch.cat([self_k[:, i], heads(k)], 2), torch.cat([self_v[:, i], heads(v)], 2)
            h = h + a.out_proj(merge(F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)))
            x = heads(c.q_proj(layer.encoder_attn_layer_norm(h)))
            h = h + c.out_proj(merge(F.scaled_dot_product_attention(x, cross_k[:, i], cross_v[:, i])))
            h = h + layer.fc2(F.gelu(layer.fc1(layer.final_layer_norm(h))))
        return torch.cat([self.project(self.norm(h)), *new], -1)


def graph_inputs(model: WhisperDecoderModel, state, tokens: Tensor) -> tuple[Tensor, ...]:
    """`StepGraph`'s inputs for appending `tokens` [B, T] to `state` (every row at one length) of the fp32 model."""
    B, T = tokens.shape
    n = int(state.cache.lengths[0])
    table = model.decoder.embed_positions.weight
    h = F.embedding(tokens, model.decoder.embed_tokens.weight) + table[n : n + T]
    S = model.max_positions
    visible = torch.zeros(B, 1, T, S + T)
    visible[..., :n] = 1.0
    visible[..., S:] = torch.tril(torch.ones(T, T))

    def pad(t: Tensor) -> Tensor:
        return F.pad(t[:, :, :n], (0, 0, 0, S - n))
    self_k = torch.stack([pad(k) for k in state.cache.k], 1)
    self_v = torch.stack([pad(v) for v in state.cache.v], 1)
    audio = state.extras["inputs"]
    cross = [model._cross(audio, i) for i in range(model.num_layers)]
    return (h, visible, self_k, self_v, torch.stack([k for k, _ in cross], 1), torch.stack([v for _, v in cross], 1))


def node_ms(graph: nn.Module, inputs: tuple[Tensor, ...], calls: int = 10) -> dict[str, float]:
    """Milliseconds per call by OpenVINO node type / kernel of `graph` at int8 (its own profiling counters), the
    twelve largest: where a compiled pass spends its time."""
    import openvino as ov

    model = export_graph(ov, int8_weights(graph), inputs)
    config = {"INFERENCE_PRECISION_HINT": "bf16", "INFERENCE_NUM_THREADS": torch.get_num_threads(),
              "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1, "DYNAMIC_QUANTIZATION_GROUP_SIZE": 512,
              "PERF_COUNT": True}
    request = ov.Core().compile_model(model, "CPU", config).create_infer_request()
    arrays = {i: x.contiguous().numpy() for i, x in enumerate(inputs)}
    for _ in range(3):
        request.infer(arrays, share_inputs=True)
    total: dict[str, float] = {}
    for _ in range(calls):
        request.infer(arrays, share_inputs=True)
        for node in request.profiling_info:
            name = f"{node.node_type} ({node.exec_type})"
            total[name] = total.get(name, 0.0) + node.real_time.total_seconds() * 1e3 / calls
    return {k: round(v, 2) for k, v in sorted(total.items(), key=lambda kv: -kv[1])[:12]}


def main(out: Path) -> None:
    torch.set_num_threads(2)
    machine = measure_machine()
    pipe = ASRPipeline.from_pretrained("builtin:base", precision="auto", draft=None)
    hf = pipe.bundle.model
    fp32 = WhisperDecoderModel(hf)
    int8 = pipe.model
    prompt = pipe.bundle.prompt("en", "transcribe", False)
    vocab = fp32.vocab_size
    graph = StepGraph(hf).eval()
    results = []
    with torch.inference_mode():
        states = {rows: filled_state(fp32, prompt, rows, KV_LEN) for rows in (1, 8)}
        eager_states = {rows: filled_state(int8, prompt, rows, KV_LEN) for rows in (1, 8)}
    for width in (8, 1):
        drafts = torch.randint(1000, 20000, (8, width), generator=torch.Generator().manual_seed(0))
        drafts[:, 0] = filler(fp32)
        example = graph_inputs(fp32, states[1], drafts[:1])
        for precision in ("fp32", "bf16", "int8"):
            compiled = compile_module(graph, example, precision)
            if compiled is None:
                results.append({"width": width, "precision": precision, "error": "did not compile"})
                continue
            for rows in (1, 8):
                inputs = graph_inputs(fp32, states[rows], drafts[:rows])
                arrays = {i: x.contiguous().numpy() for i, x in enumerate(inputs)}
                request = compiled._request

                def run(request=request, arrays=arrays):
                    return request.infer(arrays, share_inputs=True)[0]
                median, best = time_ms(run, REPEATS)
                got = compiled(*inputs)[..., :vocab]
                with torch.inference_mode():
                    want = fp32._forward(states[rows], drafts[:rows], None, None)
                    states[rows].rollback(width)
                first_err = float((got[:, 0] - want[:, 0]).norm() / want[:, 0].norm())
                row = {"width": width, "precision": precision, "rows": rows, "ms": round(median, 3),
                       "best_ms": round(best, 3), "first_call_s": round(compiled.first_call_s, 2),
                       "source": compiled.source, "logit_error": round(first_err, 5),
                       "argmax_as_fp32": float((got[:, 0].argmax(-1) == want[:, 0].argmax(-1)).float().mean())}
                if width == 8:                       # the pending token alone, the other positions padding
                    alone = list(inputs)
                    alone[0] = inputs[0].clone()
                    alone[0][:, 1:] = 0.0
                    row["same_bits_with_or_without_drafts"] = bool(torch.equal(compiled(*alone)[:, 0, :vocab],
                                                                               got[:, 0]))
                    if rows == 8:
                        one = tuple(x[:1] for x in inputs)
                        row["same_bits_alone_and_in_batch"] = bool(torch.equal(compiled(*one)[0, 0, :vocab],
                                                                               got[0, 0]))
                results.append(row)
                print(json.dumps(row), flush=True)
    for name, model, pool in (("eager fp32", fp32, states), ("eager int8 (shipped)", int8, eager_states)):
        for rows in (1, 8):
            for width in (1, 8):
                feed = torch.full((rows, width), filler(fp32))

                def step(model=model, state=pool[rows], feed=feed, width=width):
                    model._forward(state, feed, None, None)
                    state.rollback(width)
                with torch.inference_mode():
                    median, best = time_ms(step, REPEATS)
                results.append({"width": width, "precision": name, "rows": rows, "ms": round(median, 3),
                                "best_ms": round(best, 3)})
                print(json.dumps(results[-1]), flush=True)
    drafts = torch.full((1, 8), filler(fp32))
    nodes = node_ms(graph, graph_inputs(fp32, states[1], drafts))
    doc = {"suite": "decoder_step_probe", "machine": machine.to_dict(), "torch": torch.__version__,
           "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "model": "whisper-base", "kv_len": KV_LEN,
           "command": COMMAND, "results": results, "int8_width8_batch1_node_ms": nodes}
    out.write_text(json.dumps(doc, indent=1) + "\n")
    m = doc["machine"]
    lines = [f"{m['cpu']} ({', '.join(m['flags'])}; {m['threads']} threads; reads {m['read_gb_s']:.1f} GB/s), "
             f"{doc['date']}; `{COMMAND}`", "",
             f"One decoder pass of Whisper base after {KV_LEN} cache entries, milliseconds (median, best of "
             f"{REPEATS}); the compiled passes' logit error against eager fp32 (relative L2 at the first position) "
             "and arg-max agreement; at width 8 whether the first token's logits keep their bits when the other "
             "positions hold drafts (and, at batch 8, when the row runs alone).", "",
             "| pass | width | batch | ms (best) | logit error | arg-max as fp32 | same bits | first call s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        if "ms" not in r:
            lines.append(f"| OpenVINO {r['precision']} | {r['width']} | – | {r['error']} | | | | |")
            continue
        compiled_row = "logit_error" in r
        bits = [str(r[k]) for k in ("same_bits_with_or_without_drafts", "same_bits_alone_and_in_batch") if k in r]
        lines.append(f"| {'OpenVINO ' if compiled_row else ''}{r['precision']} | {r['width']} | {r['rows']} | "
                     f"{r['ms']:.2f} ({r['best_ms']:.2f}) | {r.get('logit_error', '–')} | {r.get('argmax_as_fp32', '–')} "
                     f"| {' / '.join(bits) or '–'} | {r.get('first_call_s', '–')} |")
    lines += ["", "Where the compiled int8 pass (width 8, batch 1) spends its time, by OpenVINO node (ms per call):", "",
              "| node (kernel) | ms |", "|---|---|", *(f"| {k} | {v:.2f} |" for k, v in nodes.items())]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out} and {out.with_suffix('.md')}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("decoder_step_probe.json"))
