"""`python -m mmaccel.bench.sjd2_tune`: the window / denoising-steps sweep behind SJD2's defaults.

SJD2 is lossless, so its settings move speed only. They are picked here on a development set of
seeds (`TUNE_SEED` + i, never used by `bench image`, whose timed runs and quality samples use seeds
below 20 000): target passes (NFE) and wall-clock against plain AR, same labels, seeds and batches,
at batch 1 and 16, on the model fine-tuned for SJD2 (`builtin:fashion-mnist-sjd2`). The benchmark
then reports the chosen settings on its own seeds.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any, Callable

import torch

from mmaccel.bench.image_suite import SAMPLING

TUNE_SEED = 90_000


def tune_sjd2(pipe, grid: list[dict[str, Any]], images: dict[int, int],
              log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """For each batch size b (`images[b]` images) and SJD2 setting of `grid` (window, steps, coupled): NFE
    and seconds per image of SJD2 and of AR on the same labels and seeds, and their ratios."""
    classes = pipe.model.num_classes
    rows = []
    for b, count in images.items():
        batches = [[(i + j) % classes for j in range(b)] for i in range(0, count, b)]

        def measure(method: str, **params) -> tuple[float, float]:
            nfe, seconds = 0, 0.0
            for n, labels in enumerate(batches):
                t0 = time.perf_counter()
                out = pipe.generate(labels, method, seed=TUNE_SEED + n, **SAMPLING, **params)
                seconds += time.perf_counter() - t0
                nfe += out.stats.nfe
            return nfe / len(batches), seconds / count

        pipe.generate(batches[0], "ar", **SAMPLING)                     # warm-up
        ar_nfe, ar_s = measure("ar")
        for setting in grid:
            nfe, s = measure("sjd2", **setting)
            rows.append({"batch": b, **setting, "nfe": nfe, "nfe_ratio": round(ar_nfe / nfe, 3),
                         "s_per_image": round(s, 4), "speedup": round(ar_s / s, 3)})
            log(f"[sjd2 tune] batch {b} {setting}: NFE {nfe:.1f} ({ar_nfe / nfe:.2f}x), "
                f"{s:.3f} s/image ({ar_s / s:.2f}x)")
    return rows


def main(argv: list[str] | None = None) -> int:
    from mmaccel.image.pipeline import BUILTIN_SJD2, ImagePipeline

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=BUILTIN_SJD2)
    p.add_argument("--windows", type=int, nargs="+", default=[16, 32, 48])
    p.add_argument("--steps", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--images", type=int, nargs=2, default=[8, 32], metavar=("BATCH1", "BATCH16"),
                   help="images per setting at batch 1 and at batch 16")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None, help="write the rows as JSON here")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    pipe = ImagePipeline.from_pretrained(args.model)
    grid = [{"window": w, "steps": s, "coupled": c} for c in (True, False) for w in args.windows for s in args.steps]
    rows = tune_sjd2(pipe, grid, {1: args.images[0], 16: args.images[1]})
    if args.out:
        doc = {"model": args.model, "sampling": SAMPLING, "tune_seed": TUNE_SEED, "threads": args.threads, "rows": rows}
        Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
