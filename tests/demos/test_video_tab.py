"""The video tab's events, called as Gradio calls them (no browser), over a random streaming model of the
built-in architecture: plays advance the stream with live numbers, questions get answers with their stats and
the task's ground truth, options restart the stream, and a missing model or a non-video upload is a message."""

import gradio as gr
import numpy as np
import pytest

from demos import video_tab
from demos.video_tab import TASK, UPLOAD, Session
from mmaccel.video import data

# options after the session: source, seed, upload, fps, reduction, kv reduction, method, draft keep, draft
TASK_STREAM = [TASK, 3, None, 4, "TemporalDrop (pixel)", ["QuestionPrune 25%"], "speculative", 0.1, video_tab.DRAFT]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from mmaccel.video.train import build_model, export
    from mmaccel.video.words import WordTokenizer

    path = tmp_path_factory.mktemp("video_model")
    export(build_model(WordTokenizer(data.VOCAB)), WordTokenizer(data.VOCAB), path)
    return path


def _tab(source: str):
    with gr.Blocks() as blocks:
        video_tab.build(video_tab.video_model(source))
    return blocks


@pytest.fixture(scope="module")
def tab(model_dir):
    return _tab(str(model_dir))


def handler(blocks, name: str):
    """The function behind an event, by its API name or its Python name."""
    return next(f.fn for f in blocks.fns.values() if name in (f.api_name, f.name))


def play(blocks, session, options, frames: int) -> list:
    return list(handler(blocks, "video_play")(session, *options, frames))


def test_play_advances_the_stream_with_live_numbers(tab):
    updates = play(tab, None, TASK_STREAM, 10)
    assert len(updates) == 3                                 # a live update every 4 frames, and at the end
    session, image, stats, _ = updates[-1]
    assert isinstance(session, Session) and session.frames_seen == 10 and all(u[0] is session for u in updates)
    assert image.size == (112 * video_tab.DISPLAY_SCALE,) * 2
    assert session.encoded == 5 * 16 and 0 < session.kept <= session.encoded     # 16 tokens per pair of frames
    assert "| frames seen | 10 (task stream, seed 3) |" in stats and "ingest latency per frame | last" in stats
    assert f"| KV entries | {session.pipe.kv_entries} of {session.pipe.capacity}" in stats
    frame = np.asarray(image)[::video_tab.DISPLAY_SCALE, ::video_tab.DISPLAY_SCALE]
    assert np.array_equal(frame, data.make_stream(3, 10, "test").frame(9).numpy())   # the last frame played

    more = play(tab, session, TASK_STREAM, 4)                # the next play goes on from there
    assert more[-1][0] is session and session.frames_seen == 14


def test_asking_gives_the_answer_its_stats_and_the_truth(tab):
    session = play(tab, None, TASK_STREAM, 12)[-1][0]
    ask = handler(tab, "video_ask")
    answer, history, stats = ask(session, "What is on screen now?", "speculative", "k=2")
    truth = data.ask(data.make_stream(3, 12, "test"), 11, "now").answer
    assert f"| ground truth | {truth} |" in answer and "| target passes (NFE) |" in answer
    assert "What is on screen now?" in history and "| KV entries |" in stats
    reply = session.history[-1][0]
    assert reply.frames_seen == 12 and 1 <= reply.stats.nfe <= len(reply.tokens) and reply.stats.draft_passes > 0

    plain = play(tab, None, [*TASK_STREAM[:6], "ar", 0.1, video_tab.DRAFT], 12)[-1][0]   # greedy: lossless
    ask(plain, "What is on screen now?", "ar", "")
    assert plain.history[-1][0].tokens == reply.tokens
    early = play(tab, None, [*TASK_STREAM[:7], 1.0, "its first layer (early exit)"], 12)[-1][0]
    assert early.pipe.draft.exit_layer == 1 and early.pipe.draft.shares_vision(early.pipe.model)
    ask(early, "What is on screen now?", "speculative", "k=3")
    assert early.history[-1][0].tokens == reply.tokens and early.history[-1][0].stats.draft_passes > 0


def test_question_messages(tab):
    ask = handler(tab, "video_ask")
    with pytest.raises(gr.Error, match="no frame has been played"):
        ask(None, "what is on screen now ?", "ar", "")
    session = play(tab, None, [*TASK_STREAM[:6], "ar", 0.1, video_tab.DRAFT], 2)[-1][0]
    with pytest.raises(gr.Error, match="question is empty"):
        ask(session, "  ", "ar", "")
    with pytest.raises(gr.Error, match="need a draft that has watched"):
        ask(session, "what is on screen now ?", "speculative", "k=2")
    with pytest.raises(gr.Error, match="unknown word"):
        ask(session, "what is the weather ?", "ar", "")
    with pytest.raises(gr.Error, match="no trigger head"):
        ask(session, "tell me when a bag appears ?", "ar", "")


def test_changing_an_option_restarts_the_stream(tab):
    session = play(tab, None, TASK_STREAM, 2)[-1][0]
    restart_if_changed = handler(tab, "restart_if_changed")
    assert all(v == gr.skip() for v in restart_if_changed(session, *TASK_STREAM))    # same settings: it goes on
    other_fps = [*TASK_STREAM[:3], 10, *TASK_STREAM[4:]]                        # fps is the file's: no change here
    assert restart_if_changed(session, *other_fps)[0] == gr.skip()
    ar, ngram = [*TASK_STREAM[:6], "ar", 0.1, video_tab.DRAFT], [*TASK_STREAM[:6], "ngram", 0.1, video_tab.DRAFT]
    session = play(tab, None, ar, 2)[-1][0]
    assert restart_if_changed(session, *ngram)[0] == gr.skip()                  # neither needs a draft
    restarted = restart_if_changed(session, *TASK_STREAM[:4], "none", *TASK_STREAM[5:])
    assert restarted[0] is None and restarted[1] is None
    # a play with other settings than its session's (as the API may send) starts a new stream
    fresh = play(tab, session, [TASK, 4, *TASK_STREAM[2:]], 2)[-1][0]
    assert fresh is not session and fresh.frames_seen == 2


def test_ground_truth_and_templates(tab):
    stream = data.make_stream(3, video_tab.STREAM_FRAMES, "test")
    frame = next(t for t in range(stream.num_frames) if len(stream.on_screen(t)) == 1)     # one item on screen
    session = play(tab, None, TASK_STREAM, frame + 1)[-1][0]
    item = stream.on_screen(frame)[0]
    question = video_tab.suggest(data.TEMPLATES["direction"], session)
    assert question == f"which way is the {item.class_name} moving ?"
    assert video_tab.ground_truth(session, question) == item.direction
    assert video_tab.ground_truth(session, "what colour is it ?").startswith("– (only the task's")
    assert video_tab.ground_truth(session, "which way is the cat moving ?").startswith("– ('cat' is not")


def test_a_request_fires_a_notice_with_its_truth(model_dir):
    """'tell me when a … appears ?' on a model with a trigger head (here a random one that fires at once)."""
    from mmaccel.video.stream import VideoStreamPipeline
    from mmaccel.video.trigger import TriggerHead

    base = VideoStreamPipeline.from_pretrained(str(model_dir))
    base.trigger = TriggerHead(128, data.CLASSES, threshold=1e-6)    # fires at the next segment
    session = Session(base, video_tab.settings(*TASK_STREAM[:6], "ar", 0.1, video_tab.DRAFT))
    session.feed_next()
    notice = video_tab.request_notice(session, "bag")
    assert "Watching for a **bag** after frame 0" in notice and "Ground truth:" in notice
    session.feed_next()
    assert len(session.notices) == 1 and session.notices[0].startswith("frame 1: a **bag** appeared")
    assert "**Requests that fired**" in video_tab.notices(session)


def test_a_missing_builtin_model_is_a_clear_message(monkeypatch, tmp_path):
    import mmaccel.paths

    monkeypatch.setattr(mmaccel.paths, "assets_dir", lambda: tmp_path)     # as before the model is shipped
    blocks = _tab("builtin:moving-fashion")
    with pytest.raises(gr.Error, match="built-in streaming model is not in") as info:
        play(blocks, None, TASK_STREAM, 2)
    assert info.value.title == "Model not available" and "python -m mmaccel.video.train" in info.value.message


def test_a_non_video_upload_is_a_clear_message(tab, tmp_path):
    notes = tmp_path / "notes.mp4"
    notes.write_text("these are meeting notes, not a video\n" * 20)
    upload = [UPLOAD, 0, str(notes), 4, *TASK_STREAM[4:]]
    with pytest.raises(gr.Error, match="cannot open notes.mp4 as a video") as info:
        play(tab, None, upload, 4)
    assert str(tmp_path) not in info.value.message                           # named as the user knows it
    with pytest.raises(gr.Error, match="no video: upload a file"):
        play(tab, None, [UPLOAD, 0, None, 4, *TASK_STREAM[4:]], 4)


def test_an_uploaded_video_is_cropped_and_resized(tab, tmp_path):
    import av

    path = tmp_path / "wide.mkv"
    with av.open(str(path), "w") as container:
        stream = container.add_stream("ffv1", rate=10)
        stream.width, stream.height, stream.pix_fmt = 96, 64, "bgr0"
        for i in range(6):
            pixels = np.zeros((64, 96, 3), np.uint8)
            pixels[:, 16 + 8 * i: 24 + 8 * i] = 255                              # a bar moving right
            container.mux(stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")))
        container.mux(stream.encode())
    updates = play(tab, None, [UPLOAD, 0, str(path), 10, *TASK_STREAM[4:]], 8)
    session, image, stats, _ = updates[-1]
    assert session.frames_seen == 6 and session.ended and "the source has ended" in stats and "wide.mkv" in stats
    assert session.frame.shape == (112, 112, 3) and image.size == (336, 336)
    with pytest.raises(gr.Error, match="the source has ended after 6 frames"):
        play(tab, session, [UPLOAD, 0, str(path), 10, *TASK_STREAM[4:]], 2)


def test_fit_frame_takes_the_centre_square():
    wide = np.zeros((56, 84, 3), np.uint8)
    wide[:, 14:70] = 200                                                        # the centre 56 x 56
    out = video_tab.fit_frame(wide)
    assert out.shape == (112, 112, 3) and out.dtype == np.uint8 and out.min() == 200
    square = np.full((112, 112, 3), 7, np.uint8)
    assert np.array_equal(video_tab.fit_frame(square), square)
