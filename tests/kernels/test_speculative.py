"""The fused speculative-verification kernel equals its reference and keeps the target law, checked
through Triton's interpreter on a CPU (a fresh process: TRITON_INTERPRET is read when Triton loads)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mmaccel.kernels.dispatch import triton_available, use_triton

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not triton_available(), reason="Triton is not installed")
def test_kernel_under_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-m", "tests.kernels.interpreted_speculative"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    assert "kernel checks passed" in run.stdout


def test_dispatch(monkeypatch):
    import torch

    cpu = torch.zeros(2)
    monkeypatch.setenv("MMACCEL_KERNELS", "auto")
    assert not use_triton(cpu)                                     # CPU tensors take the reference
    monkeypatch.setenv("MMACCEL_KERNELS", "torch")
    assert not use_triton(cpu)
    monkeypatch.setenv("MMACCEL_KERNELS", "fast")
    from mmaccel.errors import InputError
    with pytest.raises(InputError, match="MMACCEL_KERNELS must be"):
        use_triton(cpu)
