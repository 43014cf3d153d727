"""Where mmaccel reads its shipped weights and writes its caches."""

from __future__ import annotations

import importlib.resources
import os
from pathlib import Path


def default_cache_dir() -> Path:
    """`$MMACCEL_CACHE`, else `~/.cache/mmaccel`."""
    return Path(os.environ.get("MMACCEL_CACHE") or Path.home() / ".cache" / "mmaccel").expanduser()


def assets_dir() -> Path:
    """The package's `mmaccel/assets/` folder."""
    return Path(str(importlib.resources.files("mmaccel") / "assets"))
