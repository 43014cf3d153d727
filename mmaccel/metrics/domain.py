"""Domain FID: the Fréchet distance on the penultimate features of a small Fashion-MNIST classifier.

The FID Inception costs ~0.3 s per image on one CPU thread and was trained on ImageNet photos, not
on 28x28 clothing. For quick runs we use the same distance on a 128-d feature layer of a small CNN
trained on Fashion-MNIST, in the spirit of the domain-specific classifiers used for MNIST-like
FIDs; it runs at about 1 ms per image. `classify` uses the same network to check
class-conditional samples: the fraction whose predicted label is the requested class.

The shipped weights, `mmaccel/assets/fashion_classifier.safetensors`, are trained by
`python -m mmaccel.image.train.train_classifier` (see `docs/models.md`). Domain-FID values
are only comparable between runs that use the same weights file; `fid.reference_stats` keys its
cache on the file's hash.
"""

from __future__ import annotations

import functools
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from mmaccel.checkpoints import check_layout, read_configured, write_state_dict
from mmaccel.errors import InputError, check
from mmaccel.metrics.fid import Images, fid, to_uint8_rgb
from mmaccel.paths import assets_dir

WEIGHTS_FILE = "fashion_classifier.safetensors"
CONFIG_KEY = "mmaccel_classifier_config"
IMAGE_SIZE = 28  # the classifier's input side; larger images are downsampled with antialiasing


@dataclass(frozen=True)
class ClassifierConfig:
    channels: tuple[int, int] = (32, 64)
    feature_dim: int = 128
    num_classes: int = 10
    dropout: float = 0.3


class FashionClassifier(nn.Module):
    """conv3x3-ReLU-maxpool twice (28 -> 14 -> 7), FC to the feature layer (ReLU), FC to the classes."""

    def __init__(self, config: ClassifierConfig = ClassifierConfig()):
        super().__init__()
        self.config = config
        c1, c2 = config.channels
        self.conv1 = nn.Conv2d(1, c1, 3, padding=1)
        self.conv2 = nn.Conv2d(c1, c2, 3, padding=1)
        self.fc = nn.Linear(c2 * (IMAGE_SIZE // 4) ** 2, config.feature_dim)
        self.head = nn.Linear(config.feature_dim, config.num_classes)
        self.dropout = nn.Dropout(config.dropout)

    def features(self, x: Tensor) -> Tensor:
        """x: [B, 1, 28, 28] in [-1, 1] -> penultimate features [B, feature_dim] (after ReLU)."""
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)  # [B, c1, 14, 14]
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)  # [B, c2, 7, 7]
        return F.relu(self.fc(x.flatten(1)))

    def forward(self, x: Tensor) -> Tensor:
        """x: [B, 1, 28, 28] in [-1, 1] -> class logits [B, num_classes]."""
        return self.head(self.dropout(self.features(x)))


def to_classifier_input(images: Images) -> Tensor:
    """Any input accepted by `fid.to_uint8_rgb` -> float [N, 1, 28, 28] in [-1, 1].

    RGB is averaged to grey; other sizes are resized bilinearly with antialiasing (the image models'
    64x64 samples are downsampled 64 -> 28)."""
    x = to_uint8_rgb(images).float().mean(1, keepdim=True) / 127.5 - 1.0  # [N, 1, H, W]
    if x.shape[-2:] != (IMAGE_SIZE, IMAGE_SIZE):
        x = F.interpolate(x, size=(IMAGE_SIZE, IMAGE_SIZE), mode="bilinear", align_corners=False, antialias=True)
    return x.clamp_(-1.0, 1.0)


def default_weights_path() -> Path:
    """The shipped classifier, `mmaccel/assets/fashion_classifier.safetensors`."""
    return assets_dir() / WEIGHTS_FILE


def save_classifier(model: FashionClassifier, path: str | os.PathLike) -> Path:
    """Write `model` as `.safetensors` with its config in the metadata (read back by `load_classifier`)."""
    check(Path(path).suffix == ".safetensors", f"a classifier is saved as .safetensors, got {path}")
    return write_state_dict(model, path, CONFIG_KEY, asdict(model.config))


def load_classifier(path: str | os.PathLike | None = None) -> FashionClassifier:
    """A `FashionClassifier` in eval mode from `path` (default: the shipped weights)."""
    path = Path(path) if path is not None else default_weights_path()
    state, stored, name = read_configured(path, CONFIG_KEY, "Fashion-MNIST classifier (train one with "
                                          "`python -m mmaccel.image.train.train_classifier`)")
    if stored is None:
        raise InputError(f"{path} has no '{CONFIG_KEY}' metadata; it was not written by save_classifier")
    config = ClassifierConfig(**{**stored, "channels": tuple(stored["channels"])})
    model = FashionClassifier(config)
    check_layout(model.state_dict(), state, name, f"FashionClassifier ({config})")
    model.load_state_dict(state, strict=True)
    return model.eval()


@functools.lru_cache(maxsize=2)
def _classifier(path: str | None) -> FashionClassifier:
    return load_classifier(path)


def _batched(images: Images, batch_size: int, path, fn) -> Tensor:
    check(isinstance(batch_size, int) and batch_size >= 1, f"batch_size must be a positive int, got {batch_size!r}")
    model = _classifier(None if path is None else str(path))
    x = to_classifier_input(images)
    with torch.no_grad():
        return torch.cat([fn(model, x[i:i + batch_size]) for i in range(0, len(x), batch_size)])


def domain_features(images: Images, batch_size: int = 500, weights: str | os.PathLike | None = None) -> Tensor:
    """Penultimate features of the Fashion-MNIST classifier -> float32 [N, 128].

    `images`: anything `fid.to_uint8_rgb` accepts (uint8 [N, H, W] / [N, C, H, W], float in
    [-1, 1], PIL images); `weights` defaults to the shipped classifier."""
    return _batched(images, batch_size, weights, lambda m, x: m.features(x))


def classify(images: Images, batch_size: int = 500, weights: str | os.PathLike | None = None) -> Tensor:
    """Predicted Fashion-MNIST labels int64 [N] (see `mmaccel.image.data.CLASS_NAMES`)."""
    return _batched(images, batch_size, weights, lambda m, x: m(x).argmax(-1))


def domain_fid(generated: Images, reference: Images | tuple[Tensor, Tensor]) -> float:
    """`fid.fid(generated, reference, extractor="domain")`."""
    return fid(generated, reference, extractor="domain")
