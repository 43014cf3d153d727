"""`python -m mmaccel.bench.image_tune`: the development sweeps behind the image methods' settings.

Settings are picked here on a development set of seeds (`TUNE_SEED` + i, never used by `bench image`,
whose timed runs and quality samples use seeds below 20 000); the benchmark then reports the chosen
settings on its own seeds. Speed: target passes (NFE) and decoding wall-clock against plain AR, same
labels, seeds and batches, at batch 1 and 16. Quality (relaxed methods only; a lossless method's
settings move speed only): domain FID against the **train** split (`image_suite.tune_recipes`). Sweeps:

- `sjd2`: SJD2's window, denoising levels and coupling, on the model fine-tuned for SJD2;
- `jacobi`: coupled SJD's window with fresh guesses repeated along the row (SJD's own init) or taken
  one image row up (`init="above"`), on the built-in model;
- `zipar`: plain ZipAR's row lag s (quality and speed), on the built-in model.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from mmaccel.bench.image_suite import SAMPLING, tune_recipes

TUNE_SEED = 90_000


def tune_speed(pipe, grid: list[dict[str, Any]], images: dict[int, int],
               log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """For each batch size b (`images[b]` images) and setting of `grid` (generate keywords with a
    "method" key): NFE and decoding seconds per image (the VQ decoder not counted) of the method and of
    AR on the same labels and seeds, and their ratios. AR and every setting take turns batch by batch
    (as `bench image` runs them), so a machine that speeds up or slows down mid-sweep moves all alike."""
    classes = pipe.model.num_classes
    settings = [{"method": "ar"}] + [dict(g) for g in grid]
    rows = []
    for b, count in images.items():
        batches = [[(i + j) % classes for j in range(b)] for i in range(0, count, b)]
        nfe, seconds = [0] * len(settings), [0.0] * len(settings)
        for setting in settings:                                        # warm-up (first-call caches)
            params = dict(setting)
            pipe.generate(batches[0], params.pop("method"), **SAMPLING, **params)
        for n, labels in enumerate(batches):
            for k, setting in enumerate(settings):
                params = dict(setting)
                out = pipe.generate(labels, params.pop("method"), seed=TUNE_SEED + n, **SAMPLING, **params)
                seconds[k] += out.stats.wall_s                          # decoding only, as `bench image` times it
                nfe[k] += out.stats.nfe
        for k, setting in enumerate(settings[1:], start=1):
            rows.append({"batch": b, **setting, "nfe": nfe[k] / len(batches), "nfe_ratio": round(nfe[0] / nfe[k], 3),
                         "s_per_image": round(seconds[k] / count, 4), "speedup": round(seconds[0] / seconds[k], 3)})
            log(f"[speed tune] batch {b} {setting}: NFE {nfe[k] / len(batches):.1f} ({nfe[0] / nfe[k]:.2f}x), "
                f"{seconds[k] / count:.3f} s/image ({seconds[0] / seconds[k]:.2f}x)")
    return rows


def sweep(name: str, windows: list[int], steps: list[int]) -> tuple[str, list[dict[str, Any]]]:
    """(model, grid) of a named sweep."""
    from mmaccel.image.pipeline import BUILTIN, BUILTIN_SJD2

    if name == "sjd2":
        return BUILTIN_SJD2, [{"method": "sjd2", "window": w, "steps": s, "coupled": c}
                              for c in (True, False) for w in windows for s in steps]
    if name == "zipar":
        return BUILTIN, [{"method": "zipar", "s": s} for s in windows]
    return BUILTIN, [{"method": "sjd-coupled", "window": w, "init": i} for i in ("repeat", "above") for w in windows]


def main(argv: list[str] | None = None) -> int:
    from mmaccel.image.pipeline import ImagePipeline

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sweep", choices=("sjd2", "jacobi", "zipar"), default="sjd2")
    p.add_argument("--model", default=None, help="default: the sweep's model")
    p.add_argument("--windows", type=int, nargs="+", default=[16, 32, 48], help="windows (zipar: values of s)")
    p.add_argument("--quality-samples", type=int, default=2048,
                   help="zipar: images per setting (and for AR) scored by domain FID on the train split")
    p.add_argument("--steps", type=int, nargs="+", default=[1, 2, 4], help="sjd2: denoising levels")
    p.add_argument("--images", type=int, nargs=2, default=[8, 32], metavar=("BATCH1", "BATCH16"),
                   help="images per setting at batch 1 and at batch 16")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None, help="write the rows as JSON here")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, grid = sweep(args.sweep, args.windows, args.steps)
    model = args.model or model
    pipe = ImagePipeline.from_pretrained(model)
    images = {b: n for b, n in ((1, args.images[0]), (16, args.images[1])) if n}
    rows = tune_speed(pipe, grid, images)
    quality = None
    if args.sweep == "zipar":
        quality = tune_recipes(pipe, [{**SAMPLING, **g} for g in [{"method": "ar"}] + grid],
                               samples=args.quality_samples, seed=TUNE_SEED, tag="zipar tune")
    if args.out:
        doc = {"sweep": args.sweep, "model": model, "sampling": SAMPLING, "tune_seed": TUNE_SEED,
               "threads": args.threads,
               "command": "python -m mmaccel.bench.image_tune " + " ".join(sys.argv[1:] if argv is None else argv),
               "rows": rows, **({"quality": quality} if quality else {})}
        Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
