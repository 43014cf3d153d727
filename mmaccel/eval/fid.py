"""`mmaccel eval fid`: FID of an image folder or `.npz` against Fashion-MNIST's test split or
another image set, sharded over processes.

Features come from `mmaccel.metrics.fid.extract_features` ("inception": the standard FID Inception,
2048-d; "domain": the Fashion-MNIST classifier, 128-d, ~300x faster), extracted in fixed chunks of
`CHUNK` images that the ranks share round robin (see `distributed`), so the score is the same
for any number of processes. The reference `fashion-mnist-test` is the 10 000 test images through
`reference_stats` at the samples' (square) resolution, cached under `$MMACCEL_CACHE/fid_stats/`;
any other reference is an image set like the samples (its features are extracted the same way,
not cached). The report adds the standard deviation of the FID over bootstrap resamples of the
samples (`metrics.fid.bootstrap_std`): the noise floor of the score at this sample count.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
from torch import Tensor

from mmaccel.errors import check
from mmaccel.eval.distributed import Dist, progress
from mmaccel.eval.image_files import ImageSet, open_image_set
from mmaccel.metrics.fid import EXTRACTORS, bootstrap_std, extract_features, feature_stats, frechet_distance

FASHION_MNIST_TEST = "fashion-mnist-test"
FASHION_MNIST_TEST_COUNT = 10_000
CHUNK = 200                 # images per feature-extraction unit (fixed: results do not depend on the ranks)
BOOTSTRAP_ROUNDS = 10


def open_reference(reference: str, features: str, bootstrap_rounds: int, dist: Dist,
                   allow_none: bool = False) -> str | ImageSet | None:
    """Check the scoring options on every rank before any work: the extractor, the bootstrap rounds
    and the reference, returned as `FASHION_MNIST_TEST`, an opened `ImageSet`, or None for "none"."""
    check(features in EXTRACTORS, f"unknown --features {features!r}; choose from {', '.join(EXTRACTORS)}")
    check(isinstance(bootstrap_rounds, int) and bootstrap_rounds >= 0,
          f"--bootstrap-rounds must be >= 0, got {bootstrap_rounds}")
    if reference == FASHION_MNIST_TEST:
        return reference
    if allow_none and reference == "none":
        return None
    check(Path(reference).expanduser().exists(),
          f"--reference {reference} not found: pass {FASHION_MNIST_TEST}"
          f"{', none' if allow_none else ''}, an image folder or an .npz file")
    return dist.agree(lambda: open_image_set(reference, "--reference"))


def check_square(reference: str | ImageSet, size: tuple[int, int]) -> None:
    check(reference != FASHION_MNIST_TEST or size[0] == size[1],
          f"the {FASHION_MNIST_TEST} reference is resized to the samples' resolution, which must be square; the "
          f"samples are {size[0]}x{size[1]} (HxW)")


def set_features(image_set: ImageSet, extractor: str, dist: Dist, desc: str = "features") -> Tensor | None:
    """Features [N, D] of `image_set` (rank 0; None on the other ranks), extracted in chunks shared by the ranks."""
    n_chunks = -(-image_set.count // CHUNK)

    def extract_mine() -> dict[int, Tensor]:
        mine = {}
        for c in progress(dist.shard(n_chunks), dist, desc=desc):
            mine[c] = extract_features(image_set.load(c * CHUNK, min((c + 1) * CHUNK, image_set.count)), extractor)
        return mine

    chunks = dist.gather_units(dist.agree(extract_mine), n_chunks)
    return None if chunks is None else torch.cat(chunks)


def reference_statistics(reference: str | ImageSet, extractor: str, size: tuple[int, int],
                         dist: Dist) -> tuple[tuple[Tensor, Tensor] | None, dict]:
    """((mu [D], sigma [D, D]) on rank 0, None elsewhere; a description) of an `open_reference` result
    for samples of `size` (H, W)."""
    from mmaccel.metrics.fid import reference_stats

    if isinstance(reference, ImageSet):
        feats = set_features(reference, extractor, dist, desc="reference features")
        return (None if feats is None else feature_stats(feats)), reference.describe()
    check_square(reference, size)
    # rank 0 only: the statistics are cached after the first run (~40 min on one thread for Inception)
    stats = dist.on_main(lambda: reference_stats("test", extractor=extractor, size=size[0]))
    return stats, {"name": FASHION_MNIST_TEST, "count": FASHION_MNIST_TEST_COUNT, "size": [size[0], size[0]]}


def score(feats: Tensor, reference: tuple[Tensor, Tensor], bootstrap_rounds: int = BOOTSTRAP_ROUNDS) -> dict:
    """FID of sample features [N, D] against reference statistics, with its bootstrap std."""
    fid = frechet_distance(*feature_stats(feats), *reference)
    std = bootstrap_std(feats, reference, bootstrap_rounds)
    return {"fid": round(fid, 4), "fid_std": round(std, 4), "bootstrap_rounds": bootstrap_rounds}


def extractor_description(extractor: str) -> dict:
    from mmaccel.metrics.fid import extractor_id

    return {"features": extractor, "extractor_id": extractor_id(extractor)}


def evaluate_fid(samples: str | os.PathLike, reference: str, extractor: str, dist: Dist,
                 bootstrap_rounds: int = BOOTSTRAP_ROUNDS) -> dict | None:
    """The `mmaccel eval fid` report (rank 0; None on the other ranks)."""
    t0 = time.perf_counter()
    sample_set = dist.agree(lambda: open_image_set(samples, "--samples"))
    ref = open_reference(reference, extractor, bootstrap_rounds, dist)
    check_square(ref, sample_set.size)
    feats = set_features(sample_set, extractor, dist, desc="sample features")
    ref_stats, ref_info = reference_statistics(ref, extractor, sample_set.size, dist)
    if not dist.is_main:
        return None
    return {**score(feats, ref_stats, bootstrap_rounds), **extractor_description(extractor),
            "samples": sample_set.describe(), "reference": ref_info, "processes": dist.world_size,
            "threads": dist.threads, "seconds": round(time.perf_counter() - t0, 2)}
