"""`python -m mmaccel.bench.speed_tune`: the speed sweeps behind the lossless image methods' defaults.

A lossless method's settings move speed only. They are picked here on a development set of seeds
(`TUNE_SEED` + i, never used by `bench image`, whose timed runs and quality samples use seeds below
20 000): target passes (NFE) and wall-clock against plain AR, same labels, seeds and batches, at
batch 1 and 16. The benchmark then reports the chosen settings on its own seeds. Sweeps:

- `sjd2`: SJD2's window, denoising levels and coupling, on the model fine-tuned for SJD2;
- `jacobi`: coupled SJD's window with fresh guesses repeated along the row (SJD's own init) or taken
  one image row up (`init="above"`), on the built-in model.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Callable

import torch

from mmaccel.bench.image_suite import SAMPLING

TUNE_SEED = 90_000


def tune_speed(pipe, grid: list[dict[str, Any]], images: dict[int, int],
               log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """For each batch size b (`images[b]` images) and setting of `grid` (generate keywords with a
    "method" key): NFE and decoding seconds per image (the VQ decoder not counted) of the method and of
    AR on the same labels and seeds, and their ratios."""
    classes = pipe.model.num_classes
    rows = []
    for b, count in images.items():
        batches = [[(i + j) % classes for j in range(b)] for i in range(0, count, b)]

        def measure(method: str, **params) -> tuple[float, float]:
            nfe, seconds = 0, 0.0
            for n, labels in enumerate(batches):
                out = pipe.generate(labels, method, seed=TUNE_SEED + n, **SAMPLING, **params)
                seconds += out.stats.wall_s             # decoding only, as `bench image` times it
                nfe += out.stats.nfe
            return nfe / len(batches), seconds / count

        pipe.generate(batches[0], "ar", **SAMPLING)                     # warm-up
        ar_nfe, ar_s = measure("ar")
        for setting in grid:
            params = dict(setting)
            nfe, s = measure(params.pop("method"), **params)
            rows.append({"batch": b, **setting, "nfe": nfe, "nfe_ratio": round(ar_nfe / nfe, 3),
                         "s_per_image": round(s, 4), "speedup": round(ar_s / s, 3)})
            log(f"[speed tune] batch {b} {setting}: NFE {nfe:.1f} ({ar_nfe / nfe:.2f}x), "
                f"{s:.3f} s/image ({ar_s / s:.2f}x)")
    return rows


def sweep(name: str, windows: list[int], steps: list[int]) -> tuple[str, list[dict[str, Any]]]:
    """(model, grid) of a named sweep."""
    from mmaccel.image.pipeline import BUILTIN, BUILTIN_SJD2

    if name == "sjd2":
        return BUILTIN_SJD2, [{"method": "sjd2", "window": w, "steps": s, "coupled": c}
                              for c in (True, False) for w in windows for s in steps]
    return BUILTIN, [{"method": "sjd-coupled", "window": w, "init": i} for i in ("repeat", "above") for w in windows]


def main(argv: list[str] | None = None) -> int:
    from mmaccel.image.pipeline import ImagePipeline

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sweep", choices=("sjd2", "jacobi"), default="sjd2")
    p.add_argument("--model", default=None, help="default: the sweep's model")
    p.add_argument("--windows", type=int, nargs="+", default=[16, 32, 48])
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
    rows = tune_speed(pipe, grid, {1: args.images[0], 16: args.images[1]})
    if args.out:
        doc = {"sweep": args.sweep, "model": model, "sampling": SAMPLING, "tune_seed": TUNE_SEED,
               "threads": args.threads, "command": "python -m mmaccel.bench.speed_tune " + " ".join(argv or []),
               "rows": rows}
        Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
