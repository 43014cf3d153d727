"""CLI: bad input is one line on stderr and exit code 2, never a traceback."""

import json

import pytest

from mmaccel.cli import main


@pytest.mark.parametrize("argv, message", [
    (["bench", "nosuchsuite"], "unknown benchmark suite"),
    (["generate", "hello", "--model", "/nonexistent/model"], "does not exist"),
    (["generate", "hello", "--model", "builtin:nope"], "unknown built-in"),
])
def test_errors_are_one_line(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mmaccel: error:") and message in err[0]


@pytest.mark.parametrize("params, message", [
    (["--method", "teleport"], "unknown method"), (["--method", "speculative", "--param", "k=0"], "k must be"),
    (["--temperature", "-1"], "temperature"), (["--method", "sjd", "--param", "window=-3"], "window"),
])
def test_generate_validates_method_and_sampling(capsys, tiny_lm_dir, params, message):
    assert main(["generate", "the cat", "--model", str(tiny_lm_dir), "--draft", "none", *params]) == 2
    assert message in capsys.readouterr().err


def test_generate_prints_text_and_stats(capsys, tiny_lm_dir):
    argv = ["generate", "the cat sat", "--model", str(tiny_lm_dir), "--draft", str(tiny_lm_dir),
            "--method", "speculative", "--param", "k=3", "--max-new-tokens", "6"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    stats = json.loads(captured.err.strip().splitlines()[-1])
    assert stats["nfe"] >= 1 and captured.out.strip() != ""


def test_methods_table(capsys):
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    assert "| speculative | yes |" in out and "| medusa-typical | no (budgeted) |" in out
