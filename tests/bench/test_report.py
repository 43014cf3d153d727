"""The README's benchmark tables are generated from benchmarks/*.json, never typed by hand."""

from pathlib import Path

from mmaccel.bench.report import BEGIN, END, render

ROOT = Path(__file__).resolve().parents[2]


def test_readme_tables_match_committed_json():
    text = (ROOT / "README.md").read_text()
    block = text.split(BEGIN, 1)[1].split(END, 1)[0]
    assert block.strip() == render(ROOT / "benchmarks").strip(), "run `mmaccel bench report` to refresh README.md"
