"""Image sets on disk for FID: a folder of PNG/JPEG files or an `.npz` array.

A folder is searched **recursively** (so `DIR` of `mmaccel eval image` or any nested layout works);
files ending in .png, .jpg or .jpeg (any case) count, hidden files and folders (a leading '.', e.g.
the temporary files of an unfinished write) do not; they are read in the sorted order of their
relative paths. All images of a set must have one size (checked from the headers before any
decoding, naming the odd files); any mode is read as RGB (grey copied to 3 channels, which gives
the FID extractors the same input as the grey image).

An `.npz` holds uint8 images under `arr_0` (numpy's default, as in the ADM/guided-diffusion
reference batches) or `images`, shaped [N, H, W] (grey) or [N, H, W, C] with C = 1 or 3.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from mmaccel.errors import InputError, check

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
NPZ_KEYS = ("arr_0", "images")


@dataclass
class ImageSet:
    """N images of one size; `load(start, stop)` decodes a slice as uint8 [n, 3, H, W]."""

    source: Path
    count: int
    size: tuple[int, int]                       # (H, W)
    files: list[Path] = field(default_factory=list)   # folder sets
    array: np.ndarray | None = None             # npz sets: uint8 [N, H, W] or [N, H, W, C]

    def load(self, start: int, stop: int) -> Tensor:
        """Images [start, stop) -> uint8 [n, 3, H, W]; a file that cannot be decoded raises `InputError`."""
        if self.array is not None:
            x = torch.from_numpy(np.ascontiguousarray(self.array[start:stop]))
            x = x.unsqueeze(-1) if x.dim() == 3 else x                  # [n, H, W, C]
            return x.permute(0, 3, 1, 2).expand(-1, 3, -1, -1).contiguous()
        return torch.from_numpy(np.stack([_decode(p) for p in self.files[start:stop]])).permute(0, 3, 1, 2).contiguous()

    def describe(self) -> dict:
        return {"path": str(self.source), "count": self.count, "size": list(self.size)}


def _decode(path: Path) -> np.ndarray:
    """One image file -> uint8 [H, W, 3]."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            return np.asarray(im.convert("RGB"))
    except (OSError, ValueError, SyntaxError) as err:   # PIL's errors for truncated / corrupt files
        raise InputError(f"cannot decode image {path} ({type(err).__name__}: {err}); remove or replace it") from None


def _header_size(path: Path) -> tuple[int, int]:
    """(H, W) from an image file's header, without decoding its pixels."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            w, h = im.size
    except (OSError, UnidentifiedImageError, ValueError, SyntaxError) as err:
        raise InputError(f"cannot read image {path} ({type(err).__name__}: {err}); remove or replace it") from None
    return h, w


def image_files(folder: Path) -> list[Path]:
    """The image files under `folder` (recursive, hidden entries skipped), sorted by relative path."""
    found = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            if not name.startswith(".") and name.lower().endswith(IMAGE_SUFFIXES):
                found.append(Path(dirpath) / name)
    return sorted(found, key=lambda p: p.relative_to(folder).as_posix())


def open_image_set(path: str | os.PathLike, what: str = "--samples") -> ImageSet:
    """An `ImageSet` from a folder or an `.npz` file, validated (at least 2 images of one size)."""
    path = Path(path).expanduser()
    if not path.exists():
        raise InputError(f"{what} {path} not found: pass a folder of PNG/JPEG images or an .npz file")
    if path.is_dir():
        files = image_files(path)
        check(len(files) > 0, f"{what} {path} holds no images (looked for {', '.join(IMAGE_SUFFIXES)} files, "
                              "recursively)")
        sizes: dict[tuple[int, int], list[Path]] = {}
        for f in files:
            sizes.setdefault(_header_size(f), []).append(f)
        if len(sizes) > 1:
            common = max(sizes, key=lambda s: len(sizes[s]))
            odd = [f for s, fs in sizes.items() if s != common for f in fs]
            shown = ", ".join(f"{f.relative_to(path)} ({'x'.join(map(str, _header_size(f)))})" for f in odd[:5])
            raise InputError(f"{what} {path} mixes image sizes: most are {common[0]}x{common[1]} (HxW) but "
                             f"{len(odd)} differ: {shown}{', ...' if len(odd) > 5 else ''}; resize them to one size")
        image_set = ImageSet(path, len(files), next(iter(sizes)), files=files)
    elif path.suffix.lower() == ".npz":
        image_set = _open_npz(path, what)
    else:
        raise InputError(f"{what} {path} is neither a folder nor an .npz file")
    check(image_set.count >= 2, f"{what} {path} holds {image_set.count} image; FID needs at least 2")
    return image_set


def _open_npz(path: Path, what: str) -> ImageSet:
    try:
        with np.load(path, allow_pickle=False) as data:
            key = next((k for k in NPZ_KEYS if k in data.files), None)
            check(key is not None, f"{what} {path} has no array named {' or '.join(NPZ_KEYS)} "
                                   f"(it holds: {', '.join(data.files) or 'nothing'})")
            array = data[key]
    except InputError:
        raise
    except (OSError, ValueError) as err:
        raise InputError(f"cannot read {what} {path} as .npz ({type(err).__name__}: {err})") from None
    shape = tuple(array.shape)
    check(array.dtype == np.uint8, f"{what} {path}['{key}'] must be uint8 pixels in [0, 255], got dtype {array.dtype}")
    check(array.ndim == 3 or (array.ndim == 4 and shape[-1] in (1, 3)),
          f"{what} {path}['{key}'] must be shaped [N, H, W] or [N, H, W, C] with C = 1 or 3, got {shape}")
    check(shape[1] > 0 and shape[2] > 0, f"{what} {path}['{key}'] has empty images: {shape}")
    return ImageSet(path, shape[0], (shape[1], shape[2]), array=array)
