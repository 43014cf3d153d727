"""Plain English sentences from text sources other than `fortunes`, for drafts that generalise.

Drafts trained on one text source learn it: the Whisper drafts trained on `fortunes` quotations lost
most of their gain on other text. These sources widen the training text, each a different register:

- `man_sentences`: the Linux man-pages project (Debian's `manpages` package, sections 2-7): technical
  prose about system calls, files and conventions;
- `docstring_sentences`: the docstrings of Python's standard library, read from its source files with
  `ast` (nothing is imported): programming prose.

Nothing here may overlap the out-of-domain split (`mmaccel.speech.data.license_sentences`): every
sentence that speaks of licences, warranties, copyright or permissions is dropped, and so is every
sentence of the licence texts themselves.
"""

from __future__ import annotations

import ast
import gzip
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

from mmaccel.errors import ModelNotFoundError

MAN_PACKAGE = "manpages"
MAN_SECTIONS = ("man2", "man3", "man4", "man5", "man6", "man7")
MIN_WORDS, MAX_WORDS = 6, 24
_PLAIN = re.compile(r"^[A-Z][A-Za-z ,;'\-]+[.!?]$")
# the out-of-domain split is licence text: keep its themes out of every training source
_LEGAL = re.compile(r"licen[cs]|warrant|copyright|permission|redistribut|patent|liabil|merchantab|royalt",
                    re.IGNORECASE)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_IDENTIFIER = re.compile(r"[a-z][A-Z]")       # CamelCase names of code, which no voice reads as words


def is_plain(sentence: str) -> bool:
    """A sentence a TTS voice reads unambiguously: a capital first letter, letters and , ; ' - only,
    a final . ! or ?, 6-24 words, no all-capital words (acronyms are read letter by letter)."""
    return bool(_PLAIN.match(sentence)) and MIN_WORDS <= len(sentence.split()) <= MAX_WORDS \
        and not re.search(r"[A-Z]{2,}", sentence)


def plain_sentences(text: str) -> list[str]:
    """The plain sentences of running text (whitespace collapsed, split after . ! ?)."""
    return [s for s in _SENTENCE_END.split(" ".join(text.split())) if is_plain(s)]


# ---- man pages ----------------------------------------------------------------------------------

_ROFF_ESCAPES = re.compile(r"\\f(\[[^\]]*\]|\(..|.)|\\s[+-]?\d|\\\*(\(..|\[[^\]]*\]|.)|\\\((..)|\\[&|^%:]")
_TEXT_MACROS = re.compile(r"^\.(B|I|BR|RB|IR|RI|BI|IB|SM|SB)\s+(.*)$")


def roff_text(source: str) -> str:
    """The running text of a man page's roff source: requests dropped except the font macros, whose
    arguments are kept; escapes removed (`\\-` and `\\(em` read as a hyphen and a dash). Paragraph
    requests end a paragraph, so no sentence runs across them."""
    out = []
    for line in source.splitlines():
        if line.startswith((".", "'")):
            m = _TEXT_MACROS.match(line)
            if m is None:
                out.append("\n\n")
                continue
            line = m.group(2).replace('"', "")
        line = line.replace("\\-", "-").replace("\\(em", " - ").replace("\\e", "\\")
        out.append(_ROFF_ESCAPES.sub("", line))
    return " ".join(out)


def man_pages(package: str = MAN_PACKAGE) -> list[Path]:
    """The section 2-7 pages the Debian package installed (`dpkg -L`), in name order."""
    try:
        listed = subprocess.run(["dpkg", "-L", package], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        listed = None
    if listed is None or listed.returncode != 0:
        raise ModelNotFoundError(f"the man pages of Debian's {package!r} package are not installed; "
                                 f"install them with `apt-get install {package}`")
    pages = [Path(p) for p in listed.stdout.splitlines() if p.endswith(".gz") and Path(p).parent.name in MAN_SECTIONS]
    return sorted(p for p in pages if p.is_file() and not p.is_symlink())


def man_sentences(package: str = MAN_PACKAGE) -> list[str]:
    """Plain sentences of the package's man pages (pages in name order, duplicates dropped)."""
    out: list[str] = []
    for page in man_pages(package):
        text = roff_text(gzip.decompress(page.read_bytes()).decode("utf-8", errors="ignore"))
        for paragraph in text.split("\n\n"):
            out += plain_sentences(paragraph)
    return _clean(out)


# ---- Python docstrings --------------------------------------------------------------------------

def stdlib_sources() -> list[Path]:
    """The standard library's own modules (not site-packages, not its tests), in path order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages", "test", "tests", "idlelib", "lib2to3", "turtledemo"}
    return sorted(p for p in root.rglob("*.py") if not skip & set(p.relative_to(root).parts))


def docstring_sentences() -> list[str]:
    """Plain sentences of the docstrings of the standard library (modules, classes, functions)."""
    out: list[str] = []
    for path in stdlib_sources():
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    for paragraph in doc.split("\n\n"):
                        out += plain_sentences(paragraph)
    return _clean(out)


def _clean(found: list[str]) -> list[str]:
    """`found` in order without repeats, code identifiers, or anything of the out-of-domain split's themes."""
    from mmaccel.speech.data import license_sentences

    try:
        ood = set(license_sentences())
    except ModelNotFoundError:
        ood = set()
    seen: set[str] = set()
    out = []
    for s in found:
        if s not in seen and s not in ood and not _LEGAL.search(s) and not _IDENTIFIER.search(s):
            seen.add(s)
            out.append(s)
    return out


def python_version() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"
