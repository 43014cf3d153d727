"""`mmaccel bench image-scale`: next-scale generation (VAR) alone and with CoDe's hand-off.

The built-in next-scale models (`ScalePipeline.from_pretrained("builtin:fashion-mnist-var")`): a
large VAR (the baseline, "ar"), a small VAR alone ("ar-small", the quality floor) and CoDe at several
hand-off scales N ("code-nN": the large VAR draws scales 0..N-1, the small one the rest). Same labels,
seeds and batches for every method, interleaved in one process, through the image suite's harness
(`build_image_suite`): domain FID on the quality samples, Inception FID on `--inception-samples`
of them (the whole test split as reference from 5 000 on), class accuracy. The VAE decoder is not
timed (CoDe's protocol).

Memory: the process peak (`peak_mem_mb`, weights and Python included) hardly moves on a CPU, so each
row also carries what the method holds for generation: `cache_mb` (the largest KV cache a call
allocated), `weights_mb` (the VARs it runs) and `model_mem_mb` (their sum), with `model_mem_ratio`
against the large VAR alone at the same batch.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mmaccel.bench.harness import MethodSpec, Suite
from mmaccel.bench.image_suite import build_image_suite
from mmaccel.errors import check

TIMED_IMAGES = {1: 20, 16: 160, 64: 512}
DEFAULT_METHODS = [
    MethodSpec("ar"),
    MethodSpec("ar-small"),
    *(MethodSpec("code", {"draft_steps": n}, label=f"code-n{n}") for n in (8, 7, 6, 4)),
    MethodSpec("code", {"draft_steps": 6, "training_free": False}, label="code-n6-specialised"),
    # the headline: the refiner specialised for N = 7 at the large VAR's guidance (picked in
    # benchmarks/tune/code_guided.json), and the same without refiner guidance (half its rows: the fast point)
    *(MethodSpec("code", {"draft_steps": 7, "training_free": False, "refiner_cfg": cfg}, label=f"code-n7-specialised{tag}")
      for cfg, tag in ((3.0, ""), (0.0, "-cfg0"))),
    # the same refiner drawing at temperature 0.85 (picked on Inception features of the train split,
    # benchmarks/tune/code_inception.json)
    MethodSpec("code", {"draft_steps": 7, "training_free": False, "refiner_cfg": 3.0, "refiner_temperature": 0.85},
               label="code-n7-specialised-t085"),
]


def _weights_mb(module) -> float:
    return sum(t.numel() * t.element_size() for t in module.state_dict().values()) / 2**20


def build_image_scale_suite(quick: bool = False, methods: list[MethodSpec] | None = None, pipeline=None,
                            samples: int | None = None, inception_samples: int | None = None,
                            cache_dir: str | Path | None = None, log: Callable[[str], None] = print,
                            device: str | None = None) -> Suite:
    from mmaccel.image.scale_methods import build_scale_method
    from mmaccel.image.scale_pipeline import BUILTIN_SCALE, SCALE_SAMPLING, ScalePipeline

    pipe = pipeline or ScalePipeline.from_pretrained(BUILTIN_SCALE, device=device)
    methods = methods or DEFAULT_METHODS
    check(methods[0].name == "ar", "the first method of image-scale must be 'ar' (the large VAR alone)")

    def lossless(spec: MethodSpec) -> bool:          # the plug-in's declared exactness
        return build_scale_method(spec.name, **spec.params).lossless

    weights = {"ar": _weights_mb(pipe.model),
               "ar-small": _weights_mb(pipe.refiner) if pipe.refiner is not None else 0.0}
    weights["code"] = weights["ar"] + weights["ar-small"]
    c, r = pipe.model.config, pipe.refiner.config if pipe.refiner is not None else None
    describe = {"model": f"Fashion-MNIST VAR depth {c.depth}, width {c.embed_dim} (mmaccel/assets/fashion_var_large.safetensors)",
                "refiner": None if r is None else
                f"VAR depth {r.depth}, width {r.embed_dim} (mmaccel/assets/fashion_var_small.safetensors)",
                "tokenizer": f"fashion_msvq, {pipe.vq.vocab_size} codes, scales {list(pipe.vq.patch_nums)}",
                "timing": "generation only (the VAE decoder is not timed)"}

    def finish(doc: dict[str, Any]) -> None:
        base = {row["batch"]: row for row in doc["results"] if row["method"] == "ar"}
        for row in doc["results"]:
            name = next(spec.name for spec in methods if spec.key == row["method"])
            row["weights_mb"] = round(weights[name], 3)
            row["model_mem_mb"] = round(weights[name] + row.get("cache_mb", 0.0), 3)
        for row in doc["results"]:
            ar = base.get(row["batch"])
            if ar is not None:
                row["model_mem_ratio"] = round(row["model_mem_mb"] / ar["model_mem_mb"], 4)

    suite = build_image_suite(quick=quick, methods=methods, pipeline=pipe, samples=samples,
                              inception_samples=inception_samples, cache_dir=cache_dir, log=log, name="image-scale",
                              sampling=dict(SCALE_SAMPLING), lossless=lossless, timed=TIMED_IMAGES, describe=describe)
    suite.finish = finish
    return suite


def extra_markdown(doc: dict[str, Any]) -> str:
    """The memory each method holds for generation (the README's table beside the harness's)."""
    lines = ["| method | batch | KV cache (MB) | weights (MB) | cache + weights (MB) | vs large VAR alone |",
             "|---|---|---|---|---|---|"]
    for r in doc["results"]:
        if "model_mem_mb" in r:
            ratio = r.get("model_mem_ratio")
            lines.append(f"| {r['method']} | {r['batch']} | {r.get('cache_mb', 0):.2f} | {r['weights_mb']:.2f} | "
                         f"{r['model_mem_mb']:.2f} | {'–' if ratio is None else f'{ratio:.2f}'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """`python -m mmaccel.bench.image_scale --tune`: the development sweeps (domain FID against the train
    split, seeds from 90 000) behind `SCALE_SAMPLING` (CFG x top-k of the large VAR alone) and, with
    `--refiner-cfg`, behind CoDe's refiner guidance (hand-off `--draft-steps`, AR alongside)."""
    import argparse
    import json

    from mmaccel.bench.image_suite import tune_recipes
    from mmaccel.image.scale_pipeline import BUILTIN_SCALE, SCALE_SAMPLING, ScalePipeline

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--tune", action="store_true", required=True)
    p.add_argument("--samples", type=int, default=512)
    p.add_argument("--cfg", type=float, nargs="+", default=[0.0, 0.5, 1.0, 1.5, 2.0, 3.0])
    p.add_argument("--top-k", type=int, nargs="+", default=[0, 128])
    p.add_argument("--refiner-cfg", type=float, nargs="+", default=None,
                   help="sweep CoDe's refiner guidance instead (the built-in recipe otherwise)")
    p.add_argument("--refiner-temperature", type=float, nargs="+", default=None,
                   help="sweep CoDe's refiner temperature (with --refiner-cfg: every pair)")
    p.add_argument("--extractor", choices=("domain", "inception"), default="domain",
                   help="FID features (inception: slow; use --reference-images 2000)")
    p.add_argument("--reference-images", type=int, default=10_000, help="train-split images of the FID reference")
    p.add_argument("--draft-steps", type=int, default=7)
    p.add_argument("--specialised", action="store_true", help="the refiner specialised for --draft-steps")
    p.add_argument("--seed", type=int, default=90_000)
    p.add_argument("--out", default=None, help="write the rows as JSON here")
    args = p.parse_args(argv)
    pipe = ScalePipeline.from_pretrained(BUILTIN_SCALE)
    if args.refiner_cfg is None and args.refiner_temperature is None:
        grid = [{"cfg_scale": c, "top_k": k, "top_p": 1.0, "temperature": 1.0} for c in args.cfg for k in args.top_k]
    else:
        code = {"method": "code", "draft_steps": args.draft_steps, "training_free": not args.specialised}
        refiner = [{**({} if c is None else {"refiner_cfg": c}), **({} if t is None else {"refiner_temperature": t})}
                   for c in args.refiner_cfg or [None] for t in args.refiner_temperature or [None]]
        grid = [{"method": "ar", **SCALE_SAMPLING}] + [{**code, **SCALE_SAMPLING, **r} for r in refiner]
    rows = tune_recipes(pipe, grid, "ar", args.samples, reference_images=args.reference_images, seed=args.seed,
                        tag="image-scale tune", extractor=args.extractor)
    if args.out:
        doc = {"command": "python -m mmaccel.bench.image_scale " + " ".join(sys.argv[1:] if argv is None else argv),
               "reference": f"Fashion-MNIST train split, first {args.reference_images} images "
                            f"({args.extractor} FID, development)", "seed": args.seed, "rows": rows}
        Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
