"""The documentation site builds with --strict (a broken link, a missing page or a bad reference fails), and every
public class, function and method of the pipelines, the method registries and the server has a docstring for the
API reference to render."""

import importlib
import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTED = ("mmaccel.image.pipeline", "mmaccel.image.scale_pipeline", "mmaccel.image.continuous_pipeline",
              "mmaccel.speech.pipeline", "mmaccel.speech.ctc.pipeline", "mmaccel.speech.whisfusion.pipeline",
              "mmaccel.lm.pipeline", "mmaccel.video.stream", "mmaccel.registries", "mmaccel.core.plugin",
              "mmaccel.serve.app", "mmaccel.serve.batching", "mmaccel.serve.ray_app", "mmaccel.serve.catalogue",
              "mmaccel.serve.fields", "mmaccel.serve.speech", "mmaccel.serve.images", "mmaccel.serve.text",
              "mmaccel.serve.metrics", "mmaccel.serve.lifecycle")


def undocumented(module_name: str) -> list[str]:
    """Public classes and functions defined in the module, and public methods and properties of its public
    classes, that have no docstring (a method that overrides a documented one of a base class has its)."""
    module = importlib.import_module(module_name)
    missing = []
    for name, obj in vars(module).items():
        if name.startswith("_") or getattr(obj, "__module__", None) != module_name:
            continue
        if inspect.isfunction(obj) and not obj.__doc__:
            missing.append(name)
        if inspect.isclass(obj):
            if not obj.__doc__ or obj.__doc__.startswith(f"{name}("):        # a dataclass's generated signature
                missing.append(name)
            for attr, member in vars(obj).items():
                if attr.startswith("_"):
                    continue
                target = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
                if inspect.isfunction(target) and not inspect.getdoc(getattr(obj, attr)):
                    missing.append(f"{name}.{attr}")
    return missing


@pytest.mark.parametrize("module_name", DOCUMENTED)
def test_public_names_have_docstrings(module_name):
    assert undocumented(module_name) == [], f"{module_name}: public names without a docstring"


def test_the_site_builds_strictly(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    warnings = [line for line in done.stderr.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert done.returncode == 0 and warnings == [], "\n".join(warnings) or done.stderr[-2000:]
    assert (tmp_path / "site" / "reference" / "methods" / "index.html").exists()
