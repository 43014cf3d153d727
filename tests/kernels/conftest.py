"""The interpreter checks run in fresh processes (TRITON_INTERPRET is read when Triton loads), all started
at once as soon as collection has selected a test that needs them: they run on the cores that the
single-threaded test run leaves idle while it works through the tests before them, and each test waits
for its own."""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from mmaccel.kernels.dispatch import triton_available

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ("speculative", "pooled", "grouped", "tree")       # tests/kernels/interpreted_<name>.py
_RUNS: dict = {}                                             # name -> (process, stdout file, stderr file)


def _start() -> None:
    if _RUNS:
        return
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1", "MMACCEL_KERNELS": "auto"}
    for name in SCRIPTS:
        out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
        _RUNS[name] = (subprocess.Popen([sys.executable, "-m", f"tests.kernels.interpreted_{name}"], cwd=ROOT,
                                        env=env, stdout=out, stderr=err, text=True), out, err)


def pytest_collection_finish(session):
    if session.config.option.collectonly or not triton_available():
        return
    if any("interpreted" in getattr(item, "fixturenames", ()) for item in session.items):
        _start()


def pytest_sessionfinish(session):
    for run, out, err in _RUNS.values():
        if run.poll() is None:
            run.kill()
            run.wait()
        out.close()
        err.close()
    _RUNS.clear()


@pytest.fixture(scope="session")
def interpreted():
    """interpreted(name) waits for tests.kernels.interpreted_<name> and fails the test if its checks did."""
    _start()

    def result(name):
        run, out, err = _RUNS[name]
        run.wait(timeout=300)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
        assert run.returncode == 0, stdout[-2000:] + stderr[-4000:]
        assert "kernel checks passed" in stdout

    return result
