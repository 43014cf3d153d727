"""Pictures of how a method decoded: commit-pass heat maps, coloured tokens, word diffs."""

from __future__ import annotations

import difflib
import html

import numpy as np
from PIL import Image

# colours of multi-token passes (tokens that came from accepted drafts share their pass's colour)
PALETTE = ("#fdd49e", "#a6dba0", "#9ecae1", "#fbb4ae", "#decbe4", "#fed9a6", "#b3cde3", "#ccebc5")
SINGLE = "#eeeeee"      # a pass that committed one token, as plain AR does


def pass_heatmap(passes: np.ndarray, title: str) -> Image.Image:
    """passes [h, w] (the target pass that committed each token) -> a heat map with a colour bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(3.6, 3.1), dpi=100)
    im = ax.imshow(passes, cmap="viridis", interpolation="nearest")
    ax.set_title(title, fontsize=9)
    ax.set_xticks([]), ax.set_yticks([])
    bar = fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    bar.set_label("target pass that committed the token", fontsize=7)
    bar.ax.tick_params(labelsize=7)
    fig.tight_layout()
    fig.canvas.draw()
    image = Image.fromarray(np.asarray(fig.canvas.buffer_rgba())[..., :3].copy())
    plt.close(fig)
    return image


def token_pieces(tokenizer, tokens: list[int]) -> list[str]:
    """The text each token adds (decoded prefix by prefix, so multi-byte characters split across
    tokens come out whole on the token that completes them)."""
    pieces, previous = [], ""
    for i in range(len(tokens)):
        text = tokenizer.decode(tokens[: i + 1], skip_special_tokens=True)
        pieces.append(text[len(previous):] if text.startswith(previous) else text)
        previous = text
    return pieces


def passes_html(pieces: list[str], passes: list[int]) -> str:
    """Tokens as HTML spans, each coloured by the pass that committed it: a pass that committed several
    tokens (accepted drafts + the target's own token) gets a colour, a one-token pass stays grey."""
    sizes: dict[int, int] = {}
    for p in passes:
        sizes[p] = sizes.get(p, 0) + 1
    colours: dict[int, str] = {}
    spans = []
    for piece, p in zip(pieces, passes):
        if sizes[p] > 1 and p not in colours:
            colours[p] = PALETTE[len(colours) % len(PALETTE)]
        colour = colours.get(p, SINGLE)
        text = html.escape(piece).replace("\n", "<br>")
        spans.append(f'<span class="tok" style="background:{colour}" title="pass {p}: {sizes[p]} token(s)">{text}</span>')
    return '<div class="passes">' + "".join(spans) + "</div>"


def word_diff(before: str, after: str) -> list[tuple[str, str | None]]:
    """Words of `after` against `before` for gr.HighlightedText: unchanged words unlabelled, '+' only
    in `after`, '-' only in `before`."""
    a, b = before.split(), after.split()
    out: list[tuple[str, str | None]] = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if op == "equal":
            out.append((" ".join(b[j1:j2]) + " ", None))
            continue
        if i2 > i1:
            out.append((" ".join(a[i1:i2]) + " ", "-"))
        if j2 > j1:
            out.append((" ".join(b[j1:j2]) + " ", "+"))
    return out
