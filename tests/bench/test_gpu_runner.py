"""benchmarks/gpu/: the tree that travels to a GPU machine fits its 64 MiB (tree.sh keeps it <= 60 MiB) and holds
what run.sh's suites load; in that tree, with only the packages a GPU machine has, the suites build (default) and
run.sh runs end to end with `--device cpu --quick` (slow)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ABSENT_PACKAGES = Path(__file__).resolve().parent / "gpu_machine"      # its sitecustomize hides them
LIMIT_MIB = 60

BUILD_SUITES = """
import mmaccel, torch
from mmaccel.bench import SUITES
from mmaccel.bench.kernels_suite import _cases
from mmaccel.metrics.domain import load_classifier
assert mmaccel.__file__.startswith({root!r}), mmaccel.__file__
for name in ("image", "image-scale", "image-continuous"):
    SUITES[name](quick=True, device="cpu")
assert _cases(torch.device("cpu"), True) and load_classifier() is not None
try:
    import gguf
except ModuleNotFoundError:
    print("suites built")
"""


@pytest.fixture(scope="module")
def slim_tree(tmp_path_factory) -> Path:
    """The files `tree.sh slim` leaves to travel, hard-linked (copied across file systems) into a fresh folder."""
    listed = subprocess.run(["bash", "benchmarks/gpu/tree.sh", "list"], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.split()
    tree = tmp_path_factory.mktemp("gpu_tree")
    for rel in listed:
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(ROOT / rel, tree / rel)
        except OSError:
            shutil.copy2(ROOT / rel, tree / rel)
    return tree


def _env(tree: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MMACCEL_")}
    fashion = os.environ.get("MMACCEL_FASHION_MNIST", "/usr/share/datasets/fashion-mnist")
    return {**env, "PYTHONPATH": f"{ABSENT_PACKAGES}{os.pathsep}{tree}", "PYTHON": sys.executable,
            "MMACCEL_CACHE": str(tree / ".cache"), "MMACCEL_FASHION_MNIST": fashion, "OMP_NUM_THREADS": "2"}


def test_slim_tree_fits_and_keeps_what_the_image_suites_load(slim_tree):
    size = sum(p.stat().st_size for p in slim_tree.rglob("*") if p.is_file()) / 2**20
    assert size <= LIMIT_MIB, f"{size:.1f} MiB would travel"
    assets = {p.name for p in (slim_tree / "mmaccel" / "assets").rglob("*.safetensors")}
    assert {"fashion_gpt.safetensors", "fashion_msvq.safetensors", "fashion_mar.safetensors",
            "fashion_classifier.safetensors"} <= assets
    assert not any(name.startswith("whisper") for name in assets)


def test_suites_build_in_the_slim_tree_without_the_absent_packages(slim_tree):
    run = subprocess.run([sys.executable, "-c", BUILD_SUITES.format(root=str(slim_tree))], cwd=slim_tree,
                         env=_env(slim_tree), capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and "suites built" in run.stdout, run.stderr[-3000:]


def test_runner_refuses_an_unknown_option():
    run = subprocess.run(["bash", "benchmarks/gpu/run.sh", "--fast"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 2 and run.stderr.startswith("usage: bash benchmarks/gpu/run.sh")


@pytest.mark.slow
def test_runner_end_to_end_on_cpu(slim_tree, tmp_path):
    run = subprocess.run(["bash", "benchmarks/gpu/run.sh", "--device", "cpu", "--quick", "--out", str(tmp_path)],
                         cwd=slim_tree, env=_env(slim_tree), capture_output=True, text=True, timeout=3600)
    assert run.returncode == 0, run.stderr[-3000:]
    for name in ("kernels", "image", "image-scale", "image-continuous"):
        doc = json.loads((tmp_path / f"{name}.json").read_text())
        assert doc["command"].startswith(f"mmaccel bench {name}") and "--quick" in doc["command"]
