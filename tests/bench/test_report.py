"""The generated pages (the README's headline tables, the site's benchmark pages and nav entries, the methods
reference) are made from the committed benchmarks/**/*.json and the registries, never typed by hand."""

import json
import shutil
from pathlib import Path

from mmaccel.bench.report import BEGIN, END, HEADLINES, headline_tables, stale, suite_pages, update

ROOT = Path(__file__).resolve().parents[2]


def test_every_generated_page_matches_what_is_committed():
    assert stale(ROOT) == [], "run `mmaccel bench report` to refresh the generated pages"


def _repo(tmp_path: Path) -> Path:
    """A copy of what `bench report` reads: README, mkdocs.yml, the suites' documents and the docs' generated pages."""
    root = tmp_path / "repo"
    for name in ("README.md", "mkdocs.yml", "docs/pipelines/whisper.md"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, root / name)
    shutil.copytree(ROOT / "benchmarks", root / "benchmarks")
    shutil.copytree(ROOT / "docs" / "benchmarks", root / "docs" / "benchmarks")
    shutil.copytree(ROOT / "docs" / "reference", root / "docs" / "reference")
    return root


def test_a_new_document_changes_its_suite_page_and_a_page_no_document_makes_goes(tmp_path):
    root = _repo(tmp_path)
    doc = json.loads((root / "benchmarks" / "core.json").read_text())
    doc["command"] = "mmaccel bench core --threads 1"
    (root / "benchmarks" / "core_one_thread.json").write_text(json.dumps(doc))
    (root / "docs" / "benchmarks" / "gone.md").write_text("# a suite that no document makes\n")
    assert stale(root) == ["docs/benchmarks/core.md", "docs/benchmarks/index.md", "docs/benchmarks/gone.md"]
    assert update(root) == ["docs/benchmarks/gone.md", "docs/benchmarks/core.md", "docs/benchmarks/index.md"]
    page = (root / "docs" / "benchmarks" / "core.md").read_text()
    assert "## `mmaccel bench core --threads 1`" in page and "source `benchmarks/core_one_thread.json`" in page
    assert stale(root) == [] and not (root / "docs" / "benchmarks" / "gone.md").exists()


def test_headline_numbers_are_read_from_the_documents(tmp_path):
    root = _repo(tmp_path)
    doc = json.loads((root / "benchmarks" / "core.json").read_text())
    row = max((r for r in doc["results"] if r["method"] == "ngram"), key=lambda r: r["speedup"])
    row["speedup"] = 7.25
    (root / "benchmarks" / "core.json").write_text(json.dumps(doc))
    tables = headline_tables(root / "benchmarks")
    assert f"| SmolLM2-135M | `ngram` (k=2, max_ngram=3) | exact | 7.25× (b{row['batch']}) |" in tables
    assert stale(root) == ["docs/benchmarks/core.md", "README.md"]
    readme = (ROOT / "README.md").read_text()
    assert readme.count(BEGIN) == 1 and readme.count(END) == 1


def test_every_suite_with_documents_has_a_page_with_its_plots():
    pages = suite_pages(ROOT / "benchmarks")
    assert {"asr.md", "image.md", "serve.md", "index.md"} <= set(pages)
    assert "![asr_base](asr_base.png)" in pages["asr.md"] and "![serve](serve/serve.png)" in pages["serve.md"]
    assert all(source for h in HEADLINES for _, source, _ in h.rows)
