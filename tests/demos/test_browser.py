"""The web app as a user sees it: headless Debian chromium (driven by Playwright, no browser download) against
`python -m demos` on a free port, every tab driven through its controls. A screenshot per tab goes to
benchmarks/screenshots/ (MMACCEL_SCREENSHOTS overrides the folder)."""

from __future__ import annotations

import io
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path
from urllib.parse import urljoin

import pytest

from mmaccel.speech.data import real_utterances

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# headless, and nothing that phones home (a closed network refuses it, many times over, at every start)
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SHOTS = Path(os.environ.get("MMACCEL_SCREENSHOTS", ROOT / "benchmarks" / "screenshots"))
START_S, REQUEST_MS = 120, 240_000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The app in a subprocess, as `make demo` starts it; yields its URL."""
    assert Path(CHROMIUM).is_file(), "Debian chromium is missing: `make install` installs it"
    port = _free_port()
    log = tmp_path_factory.mktemp("app") / "app.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "demos", "--port", str(port)], cwd=ROOT, stdout=out,
                                stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.time() + START_S
        while True:
            assert proc.poll() is None, f"the app exited: {log.read_text()[-3000:]}"
            try:
                urllib.request.urlopen(url, timeout=2)
                break
            except OSError:
                assert time.time() < deadline, f"the app did not answer in {START_S} s: {log.read_text()[-3000:]}"
                time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def page(server):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(REQUEST_MS)
        page.goto(server)
        page.wait_for_selector("#image-run")
        yield page
        browser.close()


def _tab(page, name: str) -> None:
    page.get_by_role("tab", name=name, exact=True).click()


def _choose(page, elem_id: str, option: str) -> None:
    """Pick `option` in the Gradio dropdown `elem_id` as a user does: open it, click the entry."""
    page.click(f"#{elem_id} input[role=combobox]")
    page.get_by_role("option", name=option, exact=True).click()


def _set_slider(page, elem_id: str, value) -> None:
    box = page.locator(f"#{elem_id} input[type=number]")
    box.fill(str(value))
    box.press("Enter")


def _wait_text(page, selector: str, pattern: str) -> str:
    """Wait until the element's text matches `pattern` (regex); return the text."""
    page.wait_for_function("([sel, pat]) => { const e = document.querySelector(sel);"
                           " return e && new RegExp(pat).test(e.innerText || e.value || ''); }", arg=[selector, pattern])
    node = page.locator(selector)
    return node.input_value() if node.evaluate("e => 'value' in e && e.tagName !== 'DIV'") else node.inner_text()


def _images_loaded(page, selector: str, count: int) -> None:
    page.wait_for_function("([sel, n]) => { const im = [...document.querySelectorAll(sel + ' img')];"
                           " return im.length >= n && im.every(i => i.complete && i.naturalWidth > 0); }",
                           arg=[selector, count])


def _shot(page, name: str) -> None:
    """The page's screenshot for the docs, once its outputs settled; it may show no message (an error toast)."""
    page.wait_for_function("document.querySelectorAll('.generating, .pending').length === 0")   # outputs settled
    page.wait_for_timeout(1500)                     # and Gradio's fade-in of fresh outputs finished
    toasts = page.locator(".toast-body")
    assert toasts.count() == 0, f"{name}: a message is on screen: {toasts.first.inner_text()!r}"
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def _error_toast(page, pattern: str) -> str:
    """The text of the error message matching `pattern`, once it shows; then every message is dismissed, so that no
    later screenshot shows it."""
    toast = page.locator(".toast-body").filter(has_text=re.compile(pattern)).first
    toast.wait_for()
    text = toast.inner_text()
    page.evaluate("document.querySelectorAll('[data-testid=toast-close]').forEach(b => b.click())")
    page.wait_for_function("document.querySelectorAll('.toast-body').length === 0")
    return text


def test_image_tab(page):
    _tab(page, "Image")
    _choose(page, "image-class", "Bag")
    _choose(page, "image-method", "gsd")
    _set_slider(page, "image-batch", 4)
    page.click("#image-run")
    stats = _wait_text(page, "#image-stats", "NFE")
    _images_loaded(page, "#image-ar", 4)
    _images_loaded(page, "#image-method", 4)
    _images_loaded(page, "#image-heat", 1)
    _images_loaded(page, "#image-ar-heat", 1)
    nfe = re.search(r"target passes \(NFE\)\s+(\d+)\s+(\d+)", stats)
    assert nfe and int(nfe.group(1)) == 256 and 1 <= int(nfe.group(2)) < 256, stats
    assert re.search(r"TV spent\s+0\s+TV [\d.]+ per image", stats), stats
    href = page.locator("#image-files a[href*='samples.zip']").first.get_attribute("href")
    archive = zipfile.ZipFile(io.BytesIO(page.request.get(urljoin(page.url, href)).body()))
    names = archive.namelist()                                     # the download holds every PNG of both runs
    assert len(names) == 8 and all(n.endswith(".png") and "Bag" in n for n in names), names
    # ZipAR at s = 4: its wavefront takes 2 * 16 + 14 * 4 passes, drawn in the heat map of the screenshot
    _choose(page, "image-method", "zipar")
    page.click("#image-run")
    stats = _wait_text(page, "#image-stats", r"zipar[\s\S]*NFE\)\s+256\s+88\b")
    assert "not bounded" in stats, stats
    _images_loaded(page, "#image-method", 4)
    _images_loaded(page, "#image-heat", 1)
    _shot(page, "image")


def test_image2_tab(page):
    _tab(page, "Image II")
    _choose(page, "image2-class", "Ankle boot")
    _choose(page, "image2-method", "code")
    page.click("#image2-run")
    stats = _wait_text(page, "#image2-stats", "NFE")
    _images_loaded(page, "#image2-ar", 4)
    _images_loaded(page, "#image2-fast", 4)
    assert re.search(r"target passes \(NFE\)\s+10\s+7\b", stats), stats
    assert re.search(r"leading scales identical to AR \(all images\)\s+–\s+7 of 10", stats), stats
    _shot(page, "image2")


def test_speech_tab_rejects_a_text_file(page, tmp_path):
    _tab(page, "Speech")
    notes = tmp_path / "notes.wav"
    notes.write_text("these are meeting notes, not audio\n" * 20)
    page.click("#speech-audio button[aria-label='Clear']")            # the page opens with a bundled clip loaded
    page.set_input_files("#speech-audio input[type=file]", str(notes))
    page.click("#speech-run")
    assert "cannot read" in _error_toast(page, "as audio")


def test_speech_tab_transcribes_a_real_clip(page):
    clip = next(u for u in real_utterances() if u.id.endswith("0880"))      # "he was not an ill disposed young man"
    page.reload()                                                       # a fresh page: no upload left over
    page.wait_for_selector("#image-run")
    _tab(page, "Speech")
    # the page opens with a bundled clip loaded, so Transcribe works at once
    page.wait_for_selector("#speech-audio audio, #speech-audio [data-testid=waveform-controls]", state="attached")
    label = next(o for o in _clip_labels() if o.startswith(clip.id))
    _choose(page, "speech-clip", label)
    _choose(page, "speech-method", "eagle")
    page.wait_for_selector("#speech-audio audio, #speech-audio [data-testid=waveform-controls]", state="attached")
    page.click("#speech-run")
    greedy = _wait_text(page, "#speech-greedy textarea", r"\w")
    fast = _wait_text(page, "#speech-method textarea", r"\w")
    stats = _wait_text(page, "#speech-stats", "speed-up")
    assert "disposed young man" in re.sub(r"[^a-z ]+", " ", greedy.lower()) and fast == greedy
    assert re.search(r"identical to greedy\s+–\s+yes", stats), stats
    passes = re.search(r"decoder passes per token\s+([\d.]+)\s+([\d.]+)", stats)
    assert passes and float(passes.group(1)) == 1.0 and float(passes.group(2)) < 1.0, stats
    segments = _wait_text(page, "#speech-segments", r"man\.")
    assert re.search(r"0\.00\s+\d+\.\d\d\s+He was not", segments) and "young@" in segments, segments
    assert ".srt" in _wait_text(page, "#speech-subtitles", r"\.vtt")
    _shot(page, "speech")


def _clip_labels() -> list[str]:
    from demos.speech_tab import bundled_clips

    return list(bundled_clips())


def test_text_tab(page):
    _tab(page, "Text")
    page.fill("#text-prompt textarea", "List the planets of the solar system.")
    _choose(page, "text-method", "speculative")
    _set_slider(page, "text-max-new", 24)
    page.click("#text-run")
    stats = _wait_text(page, "#text-stats", "NFE")
    nfe = re.search(r"target passes \(NFE\)\s+(\d+)\s+(\d+)", stats)
    assert nfe and int(nfe.group(2)) <= int(nfe.group(1)), stats
    assert re.search(r"identical to AR\s+–\s+yes", stats), stats
    tokens = page.locator("#text-output span.tok")
    assert tokens.count() >= 5 and "Earth" in page.inner_text("#text-output")
    _shot(page, "text")


def test_text_tab_empty_prompt_is_a_message(page):
    _tab(page, "Text")
    page.fill("#text-prompt textarea", "   ")
    page.click("#text-run")
    assert "prompt is empty" in _error_toast(page, "prompt is empty")


def test_video_tab(page):
    """Play a held-out task stream with token reduction, ask a template question: live numbers, answer and
    ground truth. Before the built-in video model is shipped, its absence must be a clear message."""
    from mmaccel.paths import assets_dir
    from mmaccel.video.stream import BUILTIN_DIR

    _tab(page, "Video")
    _choose(page, "video-reduction", "TemporalDrop (pixel)")
    _set_slider(page, "video-frames", 48)
    page.click("#video-play")
    if not (assets_dir() / BUILTIN_DIR / "config.json").is_file():
        assert "python -m mmaccel.video.train" in _error_toast(page, "built-in streaming model is not in")
        pytest.skip("the built-in video model is not shipped yet: only its message was checked")
    stats = _wait_text(page, "#video-stats", r"frames seen\s+48")
    kept = re.search(r"(\d+) of (\d+) \((\d+)% kept\)", stats)
    assert kept and int(kept.group(2)) == 24 * 16 and int(kept.group(1)) <= int(kept.group(2)), stats
    _images_loaded(page, "#video-frame", 1)
    _choose(page, "video-template", "what is on screen now ?")
    page.click("#video-ask")
    answer = _wait_text(page, "#video-answer", "NFE")
    assert re.search(r"ground truth\s+\w", answer) and re.search(r"target passes \(NFE\)\s+\d+ for \d+", answer), answer
    _shot(page, "video")


def test_the_api_gets_clear_messages(server, tmp_path):
    """What a script sends through Gradio's API, bypassing the page's controls, is checked too."""
    import numpy as np
    import soundfile as sf
    from gradio_client import Client, handle_file
    from gradio_client.exceptions import AppError

    client = Client(server, verbose=False)
    image = ["Sneaker", "sjd", 8, 0, 4, 0.1, 4, False, False, 2.0, 1.0, 0, 2]

    def error(api, *args) -> str:
        with pytest.raises(AppError) as info:
            client.predict(*args, api_name=api)
        return str(info.value)

    assert "maximum" in error("/image", *image[:2], 1000, *image[3:])             # window beyond its slider
    assert "Unicorn" in error("/image", "Unicorn", *image[1:])
    image2 = ["Trouser", "code", 7, True, 8, 4, 16, 1, True, 0, 2]
    assert "maximum" in error("/image2", *image2[:2], 12, *image2[3:])            # N beyond its slider
    assert "no refiner specialised for draft_steps=3" in error("/image2", *image2[:2], 3, *image2[3:])
    silent, long = tmp_path / "silent.wav", tmp_path / "long.wav"
    sf.write(silent, np.zeros(16_000 * 2, dtype=np.int16), 16_000)
    noise = (np.random.default_rng(0).standard_normal(16_000 * 660) * 3000).astype(np.int16)   # 11 minutes
    sf.write(long, noise, 16_000)
    assert "silent" in error("/speech", handle_file(str(silent)), "eagle", "k=4", True)
    assert "up to 10" in error("/speech", handle_file(str(long)), "eagle", "k=4", True)
    assert "KEY=VALUE" in error("/speech", handle_file(str(silent)), "eagle", "k4", True)
    assert "k must be" in error("/text", "Hello.", "speculative", "k=0", 8, 0.0, 0, 1.0, 0)
