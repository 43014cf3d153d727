"""Imported at start-up by the Python of tests/bench/test_gpu_runner.py (on its PYTHONPATH): the packages that a
lent GPU machine's python3 lacks can neither be imported nor found, as there: `importlib.util.find_spec` says None
and `importlib.metadata` knows no such distribution (libraries probe optional packages both ways)."""

import importlib.abc
import importlib.metadata
import importlib.util
import sys

# diffusers is absent there too, but benchmarks/gpu/tree.sh carries its wheel and run.sh installs it
ABSENT = {"av", "flashlight", "gguf", "gradio", "jiwer", "open_clip", "playwright", "pyctcdecode",
          "pygtrie", "rapidfuzz", "soundfile", "soxr", "torch_fidelity"}


def _absent(name: str) -> bool:
    return name.partition(".")[0].lower().replace("-", "_") in ABSENT


class _Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if _absent(name):
            raise ModuleNotFoundError(f"No module named {name!r} (absent on the GPU machines)", name=name)
        return None


_find_spec = importlib.util.find_spec


def _find_spec_unless_absent(name, package=None):
    return None if _absent(name) else _find_spec(name, package)


_from_name = importlib.metadata.Distribution.from_name.__func__


def _from_name_unless_absent(cls, name):
    if _absent(name):
        raise importlib.metadata.PackageNotFoundError(name)
    return _from_name(cls, name)


importlib.util.find_spec = _find_spec_unless_absent
importlib.metadata.Distribution.from_name = classmethod(_from_name_unless_absent)
sys.meta_path.insert(0, _Absent())
