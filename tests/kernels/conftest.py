"""The interpreter checks run in fresh processes (TRITON_INTERPRET is read when Triton loads), all started
at once on first use so that they share the machine's cores; each test waits for its own."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ("speculative", "pooled", "grouped", "tree")       # tests/kernels/interpreted_<name>.py


@pytest.fixture(scope="session")
def interpreted(tmp_path_factory):
    """interpreted(name) waits for tests.kernels.interpreted_<name> and fails the test if its checks did."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1", "MMACCEL_KERNELS": "auto"}
    logs = tmp_path_factory.mktemp("interpreted")
    runs = {}
    for name in SCRIPTS:
        out, err = open(logs / f"{name}.out", "w+"), open(logs / f"{name}.err", "w+")
        runs[name] = (subprocess.Popen([sys.executable, "-m", f"tests.kernels.interpreted_{name}"], cwd=ROOT, env=env,
                                       stdout=out, stderr=err, text=True), out, err)

    def result(name):
        run, out, err = runs[name]
        run.wait(timeout=300)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
        assert run.returncode == 0, stdout[-2000:] + stderr[-4000:]
        assert "kernel checks passed" in stdout

    yield result
    for run, out, err in runs.values():
        if run.poll() is None:
            run.kill()
            run.wait()
        out.close()
        err.close()

