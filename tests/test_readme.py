"""Every code block of the README runs as it is written: the examples a newcomer copies first. The server example
runs against `mmaccel serve`'s app on a free loopback port (its address is the only text replaced)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCKS = re.findall(r"```(\w*)\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
SERVED = "http://127.0.0.1:8000"


def test_the_readme_holds_only_python_blocks_and_says_where_they_run():
    assert BLOCKS and all(language == "python" for language, _ in BLOCKS)
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


@pytest.mark.parametrize("code", [code for _, code in BLOCKS if SERVED not in code],
                         ids=lambda code: re.search(r"^from (\S+) import", code, re.M).group(1))
def test_an_example_runs(code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {"__name__": "readme"})


def test_the_server_example_runs():
    from mmaccel.bench.serve_suite import Served
    from mmaccel.serve.app import ServeConfig, create_app

    (code,) = [code for _, code in BLOCKS if SERVED in code]
    with Served(create_app(ServeConfig(models=("whisper-tiny.en",)))) as served:
        exec(compile(code.replace(SERVED, served.url), "README.md", "exec"), {"__name__": "readme"})
