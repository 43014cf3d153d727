"""mkdocs hook: the plots and screenshots under `benchmarks/` are published at `benchmarks/...` in the site, beside
the generated benchmark pages, so that a page links `serve.png` or `../benchmarks/screenshots/image.png` without a
copy of the file in `docs/`."""

from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]


def on_files(files, config):
    for path in sorted((ROOT / "benchmarks").rglob("*.png")):
        files.append(File(str(path.relative_to(ROOT)), str(ROOT), config["site_dir"], config["use_directory_urls"]))
    return files
