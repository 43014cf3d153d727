"""`mmaccel bench image-continuous`: continuous-token generation (MAR-style) alone, in MAR's multi-token mode, and with CSpD.

The built-in models (`ContinuousPipeline.from_pretrained("builtin:fashion-mnist-mar")`): the target
one token per step ("ar", CSpD's baseline), the target in MAR's multi-token mode ("mar-4": 4 tokens a
step on average, MAR's default; "mar-8"), the draft model alone ("ar-draft", the quality floor) and CSpD
("cspd": the reference settings, 8 drafts a verification, 15 % pre-filling, inner temperature 42;
"cspd-exact": inner temperature 1, the exact density ratio; "cspd-16", "cspd-16-p05": 16 drafts a
verification, 15 % or 5 % pre-filling, settings from the development sweep). Same labels, seeds and batches for every
method, interleaved in one process, through the image suite's harness (`build_image_suite`): domain
FID on the quality samples, Inception FID on `--inception-samples` of them (the whole test split as
reference from 5 000 on), class accuracy. The KL decoder is not timed.

`nfe` counts target transformer passes and `draft_passes` the draft's; every pass is followed by the
diffusion head's `diffusion_steps` denoising calls for the tokens it reveals, which the wall-clock
includes. `mean_accepted` is the number of drafts kept per verified block (of `num_draft`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from mmaccel.bench.harness import MethodSpec, Suite
from mmaccel.bench.image_suite import build_image_suite
from mmaccel.errors import check

TIMED_IMAGES = {1: 20, 16: 160}
DEFAULT_METHODS = [
    MethodSpec("ar"),
    MethodSpec("mar", label="mar-4"),
    MethodSpec("mar", {"num_iter": 8}, label="mar-8"),
    MethodSpec("ar-draft"),
    MethodSpec("cspd"),
    MethodSpec("cspd", {"inner_temperature": 1.0}, label="cspd-exact"),
    # 16 drafts a verification, picked on development seeds (benchmarks/tune/cspd_prefill.json) with the
    # reference's pre-filling and with a third of it.
    MethodSpec("cspd", {"num_draft": 16}, label="cspd-16"),
    MethodSpec("cspd", {"num_draft": 16, "prefill_ratio": 0.05}, label="cspd-16-p05"),
]


def describe(pipe) -> dict[str, Any]:
    t, d, k = pipe.model.config, pipe.draft.config if pipe.draft is not None else None, pipe.tokenizer.config
    return {"model": f"Fashion-MNIST MAR-style target: width {t.width}, depth {t.depth}, head {t.head_width}x{t.head_depth} "
                     "(mmaccel/assets/fashion_mar.safetensors)",
            "draft": None if d is None else f"width {d.width}, depth {d.depth}, head {d.head_width}x{d.head_depth} "
                                            "(mmaccel/assets/fashion_mar_draft.safetensors)",
            "tokenizer": f"fashion_kl: {k.grid}x{k.grid} tokens of {k.latent_channels} channels from {k.image_size}x"
                         f"{k.image_size} pixels (decoded images resized to 64x64)",
            "timing": "generation only (the KL decoder is not timed)"}


def build_image_continuous_suite(quick: bool = False, methods: list[MethodSpec] | None = None, pipeline=None,
                                 samples: int | None = None, inception_samples: int | None = None,
                                 cache_dir: str | Path | None = None, log: Callable[[str], None] = print,
                                 device: str | None = None) -> Suite:
    from mmaccel.image.continuous_methods import build_continuous_method
    from mmaccel.image.continuous_pipeline import BUILTIN_CONTINUOUS, CONTINUOUS_SAMPLING, ContinuousPipeline

    pipe = pipeline or ContinuousPipeline.from_pretrained(BUILTIN_CONTINUOUS, device=device)
    methods = methods or DEFAULT_METHODS
    check(methods[0].name == "ar", "the first method of image-continuous must be 'ar' (the target, one token a step)")

    def lossless(spec: MethodSpec) -> bool:
        """The plug-in's declared exactness, at the baseline's schedule (a `num_iter` of its own is another one)."""
        params = dict(spec.params)
        steps = params.pop("num_iter", None)        # a sampling option, not a method parameter
        built = build_continuous_method(spec.name, **params)
        return steps is None and built.lossless

    return build_image_suite(quick=quick, methods=methods, pipeline=pipe, samples=samples,
                             inception_samples=inception_samples, cache_dir=cache_dir, log=log,
                             name="image-continuous", sampling=dict(CONTINUOUS_SAMPLING), lossless=lossless,
                             timed=TIMED_IMAGES, describe=describe(pipe))


TUNE_SEED = 90_000          # development seeds: the benchmark never uses them


def cspd_grid(num_draft: list[int], inner_temperature: list[float], prefill_ratio: list[float],
              num_iter: list[int | None] = (None,)) -> list[dict[str, Any]]:
    """The `--tune cspd` entries: the target one token a step, MAR's multi-token mode (16 and 8 steps and
    every other schedule of `num_iter`), the draft alone one token a step and at every schedule, and CSpD
    for every combination (`None` in `num_iter`: one token a step)."""
    schedules = [{} if n is None else {"num_iter": n} for n in num_iter]
    multi = [s for s in schedules if s]
    return [{"method": "ar"}, {"method": "mar"}, {"method": "mar", "num_iter": 8}, {"method": "ar-draft"},
            *({"method": "mar", **s} for s in multi if s["num_iter"] not in (16, 8)),
            *({"method": "ar-draft", **s} for s in multi),
            *({"method": "cspd", **s, "num_draft": k, "inner_temperature": t, "prefill_ratio": r}
              for s in schedules for k in num_draft for t in inner_temperature for r in prefill_ratio)]


def main(argv: list[str] | None = None) -> int:
    """`python -m mmaccel.bench.image_continuous --tune sampling|cspd`: the development sweeps behind
    `CONTINUOUS_SAMPLING` (guidance and diffusion steps of the target alone, one token a step) and behind the
    CSpD and multi-token rows of the benchmark (their quality and cost on development seeds)."""
    import argparse
    import json
    import sys

    from mmaccel.bench.image_suite import tune_recipes
    from mmaccel.image.continuous_pipeline import BUILTIN_CONTINUOUS, CONTINUOUS_SAMPLING, ContinuousPipeline

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--tune", choices=("sampling", "cspd"), required=True)
    p.add_argument("--samples", type=int, default=512)
    p.add_argument("--cfg", type=float, nargs="+", default=[2.0, 3.0, 4.0, 5.0])
    p.add_argument("--diffusion-steps", type=int, nargs="+", default=[10, 25])
    p.add_argument("--num-draft", type=int, nargs="+", default=[4, 8, 16])
    p.add_argument("--inner-temperature", type=float, nargs="+", default=[1.0, 10.0, 42.0])
    p.add_argument("--prefill-ratio", type=float, nargs="+", default=[0.15])
    p.add_argument("--num-iter", type=int, nargs="+", default=[None],
                   help="CSpD's step schedules (default: one token a step); also adds MAR's multi-token mode and "
                        "the draft alone at each")
    p.add_argument("--out", default=None, help="write the rows as JSON here")
    args = p.parse_args(argv)
    pipe = ContinuousPipeline.from_pretrained(BUILTIN_CONTINUOUS)
    if args.tune == "sampling":
        grid = [{"cfg": c, "diffusion_steps": s} for c in args.cfg for s in args.diffusion_steps]
    else:
        grid = cspd_grid(args.num_draft, args.inner_temperature, args.prefill_ratio, args.num_iter)
        grid = [{**CONTINUOUS_SAMPLING, **g} for g in grid]
    rows = tune_recipes(pipe, grid, "ar", args.samples, seed=TUNE_SEED, tag=f"image-continuous tune {args.tune}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"command": "python -m mmaccel.bench.image_continuous "
                                                         + " ".join(sys.argv[1:] if argv is None else argv),
                                              "samples": args.samples, "seed": TUNE_SEED, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
