"""Fashion-MNIST, the real small image data set the tiny image models are trained on.

The files come from the Debian package `dataset-fashion-mnist` (MIT, Zalando; installed by
`make install`): `/usr/share/datasets/fashion-mnist/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz`.
Nothing is downloaded at run time.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from mmaccel.errors import InputError, ModelNotFoundError, check

FASHION_MNIST_ROOT = Path("/usr/share/datasets/fashion-mnist")
INSTALL_HINT = "sudo apt-get install -y dataset-fashion-mnist"

# Label i of Fashion-MNIST (Xiao et al. 2017, Table 1).
CLASS_NAMES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
               "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")

_PREFIX = {"train": "train", "test": "t10k"}
_IDX_MAGIC = {"images": 2051, "labels": 2049}


def _read_idx(path: Path, kind: str) -> np.ndarray:
    """One gzip'd IDX file -> uint8 array ([N, 28, 28] images or [N] labels)."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    header = 16 if kind == "images" else 8
    magic, n = (int.from_bytes(raw[i:i + 4], "big") for i in (0, 4))
    if magic != _IDX_MAGIC[kind] or len(raw) < header:
        raise InputError(f"{path} is not an IDX {kind} file (magic {magic}, expected {_IDX_MAGIC[kind]})")
    data = np.frombuffer(raw, np.uint8, offset=header)
    if kind == "images":
        rows, cols = (int.from_bytes(raw[i:i + 4], "big") for i in (8, 12))
        return data.reshape(n, rows, cols)
    return data[:n]


def load_fashion_mnist(split: str = "train", root: str | Path | None = None) -> tuple[Tensor, Tensor]:
    """Fashion-MNIST `split` ("train": 60 000, "test": 10 000) -> (images uint8 [N, 28, 28], labels int64 [N]).

    `root` defaults to `$MMACCEL_FASHION_MNIST`, else the Debian package's directory; a missing file raises
    `ModelNotFoundError`."""
    check(split in _PREFIX, f"split must be 'train' or 'test', got {split!r}")
    root = Path(root or os.environ.get("MMACCEL_FASHION_MNIST") or FASHION_MNIST_ROOT)
    paths = {"images": root / f"{_PREFIX[split]}-images-idx3-ubyte.gz",
             "labels": root / f"{_PREFIX[split]}-labels-idx1-ubyte.gz"}
    missing = [str(p) for p in paths.values() if not p.is_file()]
    if missing:
        raise ModelNotFoundError(f"Fashion-MNIST {split} split not found: missing {', '.join(missing)}. "
                                 f"Install it with `{INSTALL_HINT}` (or `make install`), or pass root=DIR "
                                 "holding the four *-ubyte.gz files.")
    images = _read_idx(paths["images"], "images")
    labels = _read_idx(paths["labels"], "labels")
    if len(images) != len(labels):
        raise InputError(f"{paths['images']} has {len(images)} images but {paths['labels']} has {len(labels)} labels")
    return torch.from_numpy(images.copy()), torch.from_numpy(labels.astype(np.int64))


def to_model_images(images: Tensor, size: int = 64) -> Tensor:
    """Grey uint8 images [N, H, W] -> float [N, 3, size, size] in [-1, 1] (bilinear resize, grey copied to RGB).

    At size 64 a downsample-4 tokenizer gives a 16x16 token grid."""
    check(isinstance(images, Tensor) and images.dim() == 3,
          f"to_model_images expects grey images shaped [N, H, W], got "
          f"{tuple(images.shape) if isinstance(images, Tensor) else type(images).__name__}")
    check(images.dtype == torch.uint8, f"to_model_images expects uint8 pixels in [0, 255], got dtype {images.dtype}")
    check(isinstance(size, int) and size >= 1, f"size must be a positive int, got {size!r}")
    x = images.float().unsqueeze(1) / 127.5 - 1.0  # [N, 1, H, W]
    if x.shape[-2:] != (size, size):
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    return x.clamp_(-1.0, 1.0).expand(-1, 3, -1, -1).contiguous()
