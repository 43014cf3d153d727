"""Pictures of decoding: heat maps, pass-coloured tokens, word diffs."""

import numpy as np

from demos.render import SINGLE, pass_heatmap, passes_html, token_pieces, word_diff


def test_word_diff_marks_added_and_dropped_words():
    diff = word_diff("he was not an ill disposed man", "he was not ill disposed young man")
    assert ("an ", "-") in diff and ("young ", "+") in diff
    assert "".join(w for w, label in diff if label != "-").split() == "he was not ill disposed young man".split()
    assert all(label is None for _, label in word_diff("same words", "same words"))


def test_passes_html_colours_multi_token_passes_only():
    html = passes_html(["a", " b", " c", "<d>"], [1, 2, 2, 3])
    spans = html.split("</span>")
    assert SINGLE in spans[0] and SINGLE in spans[3] and SINGLE not in spans[1]
    assert spans[1].split("background:")[1][:7] == spans[2].split("background:")[1][:7]     # one pass, one colour
    assert "&lt;d&gt;" in html and 'title="pass 2: 2 token(s)"' in html


class _Tokenizer:
    """Byte tokens, so a two-byte character spans two tokens."""

    def decode(self, ids, skip_special_tokens=True):
        return bytes(ids).decode("utf-8", errors="replace").replace("\ufffd", "")


def test_token_pieces_join_to_the_text():
    ids = list("café".encode())
    pieces = token_pieces(_Tokenizer(), ids)
    assert "".join(pieces) == "café" and len(pieces) == len(ids)


def test_pass_heatmap_is_an_image():
    image = pass_heatmap(np.arange(1, 17).reshape(4, 4), "AR: 16 passes")
    assert image.mode == "RGB" and image.width > 100 and image.height > 100
