"""The ceiling of draft-and-verify for Whisper base on this machine: an oracle draft that proposes
greedy's own next tokens for free (every draft accepted, no draft cost), against greedy and the
shipped draft decoder, on the first N benchmark utterances at batch 1, interleaved per utterance.

    python benchmarks/ceiling/asr_ceiling.py [N] > benchmarks/ceiling/asr_base.json

What it shows: how much of greedy's decoding time any lossless drafting can remove here at all
(only the target's verify passes remain), and how much of that the real draft gets.
"""

from __future__ import annotations

import json
import sys
import time

import torch

from mmaccel.bench.asr_suite import load_corpus
from mmaccel.bench.harness import device_name
from mmaccel.core.proposers import Draft, DraftModelProposer, Proposer
from mmaccel.core.speculative import LoopConfig, decode
from mmaccel.speech.audio import log_mel
from mmaccel.speech.pipeline import MAX_NEW_TOKENS, ASRPipeline


class Oracle(Proposer):
    """Proposes the next k tokens of a known transcript (one row)."""

    def __init__(self, transcript: list[int], prompt_len: int, eot: int):
        self.transcript, self.prompt_len, self.eot = transcript, prompt_len, eot

    def propose(self, ctx, k):
        done = len(ctx.history[0]) - self.prompt_len
        nxt = self.transcript[done : done + k]
        return Draft(torch.tensor([nxt + [self.eot] * (k - len(nxt))]))


def main(n: int) -> dict:
    torch.set_num_threads(2)
    asr = ASRPipeline.from_pretrained("builtin:base")
    prompt, eot = asr.bundle.prompt("en"), asr.bundle.tokens.end_of_text
    corpus = load_corpus(60)[:n]
    inputs = [asr.model.encode(log_mel(asr.bundle.feature_extractor, [a]), prompt, [a.duration]) for _, a, _ in corpus]
    target = asr.argmax_model

    def once(inp, config) -> tuple[float, object]:
        inp.cross_kv.clear()
        inp.windows.clear()
        t0 = time.perf_counter()
        g = decode(target, inp, config, max_new_tokens=MAX_NEW_TOKENS, eos_token_id=eot, prompt_tokens=[prompt])
        return time.perf_counter() - t0, g

    greedy = [once(inp, LoopConfig())[1].tokens[0] for inp in inputs]
    spec = asr.resources().draft
    configs = {"greedy": lambda i: LoopConfig()}
    for k in (2, 4, 8):
        configs[f"oracle-k{k}"] = lambda i, k=k: LoopConfig(proposer=Oracle(greedy[i], len(prompt), eot), k=k)
    configs["speculative-k8-s0.8"] = lambda i: LoopConfig(proposer=DraftModelProposer(spec, 0.8), k=8)
    configs["speculative-k8-s0.8-sib2"] = lambda i: LoopConfig(proposer=DraftModelProposer(spec, 0.8, 2), k=8)
    # interleaved per utterance, in rotating order: this machine's speed drifts between whole passes
    seconds, passes = dict.fromkeys(configs, 0.0), dict.fromkeys(configs, 0)
    names = list(configs)
    for name in names:                                                      # warm-up
        once(inputs[0], configs[name](0))
    for i, inp in enumerate(inputs):
        for name in names[i % len(names):] + names[: i % len(names)]:
            s, g = once(inp, configs[name](i))
            assert g.tokens[0] == greedy[i], name
            seconds[name] += s
            passes[name] += g.stats.nfe
    n_tokens = sum(len(t) for t in greedy)
    rows = [{"method": name, "decode_s": round(seconds[name], 3), "passes_per_token": round(passes[name] / n_tokens, 3),
             "decoder_speedup": round(seconds["greedy"] / seconds[name], 3)} for name in names]
    return {"utterances": n, "tokens": n_tokens, "batch": 1, "device": device_name(),
            "command": f"python benchmarks/ceiling/asr_ceiling.py {n}", "results": rows}


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]) if len(sys.argv) > 1 else 20), indent=1))
