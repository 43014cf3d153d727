"""The app's shared pieces: parameters typed as text, range checks, errors turned into page messages."""

import threading
import time

import gradio as gr
import pytest

from demos.shared import SharedModel, number, parse_params, shown_on_page
from mmaccel.errors import InputError, ModelNotFoundError


def test_parse_params():
    assert parse_params("k=8, stop_below=0.5 coupled=true stand_in=copy") == \
        {"k": 8, "stop_below": 0.5, "coupled": True, "stand_in": "copy"}
    assert parse_params("") == {} and parse_params(None) == {}
    with pytest.raises(InputError, match="KEY=VALUE"):
        parse_params("k 8")


@pytest.mark.parametrize("value, message", [(11, r"in \[1, 10\]"), ("3", "must be a number"), (True, "must be a number"),
                                            (2.5, "whole number")])
def test_number_checks_what_the_api_sends(value, message):
    with pytest.raises(InputError, match=message):
        number(value, "batch", 1, 10, integer=True)
    assert number(4.0, "batch", 1, 10, integer=True) == 4


def test_errors_become_page_messages():
    @shown_on_page
    def bad_input():
        raise InputError("the prompt is empty")

    @shown_on_page
    def crash():
        raise RuntimeError("boom " * 200)

    with pytest.raises(gr.Error, match="the prompt is empty"):
        bad_input()
    with pytest.raises(gr.Error) as info:
        crash()
    assert info.value.message.startswith("RuntimeError: boom") and len(info.value.message) < 450


def test_a_generator_handler_stays_a_generator_and_its_errors_become_messages():
    """Live updates (a play of the video tab): Gradio streams a handler only if it is a generator function,
    and an error after some updates must still reach the page as a message."""
    import inspect

    @shown_on_page
    def updates(n):
        yield from range(n)
        raise ModelNotFoundError("the model is not there yet")

    assert inspect.isgeneratorfunction(updates)
    seen = []
    with pytest.raises(gr.Error, match="not there yet") as info:
        for value in updates(2):
            seen.append(value)
    assert seen == [0, 1] and info.value.title == "Model not available"


def test_a_shared_model_loads_once_and_serves_one_request_at_a_time():
    loads, inside, overlap = [], [0], []

    def load():
        loads.append(1)
        return object()

    model = SharedModel("test", load)
    seen = []

    def request():
        with model.use() as value:
            inside[0] += 1
            overlap.append(inside[0])
            time.sleep(0.01)                    # without the lock, the other requests would come in now
            seen.append(value)
            inside[0] -= 1

    threads = [threading.Thread(target=request) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(loads) == 1 and max(overlap) == 1 and len({id(v) for v in seen}) == 1


def test_method_menus_and_help_come_from_the_registries():
    """The speech and video tabs offer their pipelines' registered methods (the speech tab those whose needs the
    app's Whisper loads), with each method's parameters and exactness as its help."""
    from demos import speech_tab, video_tab
    from demos.shared import method_help, method_menu
    from mmaccel.speech.pipeline import ASRPipeline
    from mmaccel.video.stream import VideoStreamPipeline

    assert video_tab.METHODS == tuple(VideoStreamPipeline.methods())
    assert set(speech_tab.METHODS) == set(ASRPipeline.methods()) - {"greedy", "speculative-cross"}
    assert set(speech_tab.DEFAULT_PARAMS) <= set(speech_tab.METHODS) and set(video_tab.DEFAULT_PARAMS) <= set(video_tab.METHODS)
    assert method_menu(ASRPipeline.methods(), loaded=()) == ("greedy", "beam", "early-exit", "ngram")
    assert [m for m in video_tab.METHODS if video_tab.drafted(m)] == ["speculative", "tree", "early-exit"]
    text = method_help(ASRPipeline.methods()["calm"])
    assert text.startswith("**calm**: ") and "relaxed (budget: `threshold`)" in text
    assert "- `threshold` (float, default `0.9`, [0.0, 1.0]): leave after" in text
