"""Where mmaccel reads its shipped weights and writes its caches."""

from __future__ import annotations

import importlib.resources
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

CACHE_MARKER = "mmaccel_cache.json"   # written last into a converted-weights cache directory


def default_cache_dir() -> Path:
    """`$MMACCEL_CACHE`, else `~/.cache/mmaccel`."""
    return Path(os.environ.get("MMACCEL_CACHE") or Path.home() / ".cache" / "mmaccel").expanduser()


def assets_dir() -> Path:
    """The package's `mmaccel/assets/` folder."""
    return Path(str(importlib.resources.files("mmaccel") / "assets"))


def write_cache_dir(dest: Path, write: Callable[[Path], None], marker: dict,
                    is_complete: Callable[[Path], bool]) -> None:
    """Build a cache directory atomically: `write(tmp)` fills a fresh temporary sibling of `dest`,
    the `CACHE_MARKER` file (`marker` as JSON) is added last and the directory is renamed into place.
    A directory without the marker is never a cache, so a killed conversion leaves none behind; a
    `dest` that exists is stale and replaced, unless another process finished it first
    (`is_complete(dest)`)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    now = time.time()
    for old in dest.parent.glob(f".{dest.name}.tmp-*"):      # leftovers of killed conversions (recent
        if now - old.stat().st_mtime > 3600:                  # ones may still be running)
            shutil.rmtree(old, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)       # mkdtemp makes it private; the cache is an ordinary directory
        write(tmp)
        (tmp / CACHE_MARKER).write_text(json.dumps(marker, indent=2))
        if dest.exists() and not is_complete(dest):
            shutil.rmtree(dest)
        try:
            os.rename(tmp, dest)
        except OSError:
            if not is_complete(dest):        # lost a race only if the winner finished
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
