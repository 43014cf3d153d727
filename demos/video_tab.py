"""Video tab: the built-in streaming video model (a small Qwen2.5-VL trained on moving Fashion-MNIST) watches
a held-out task stream or an uploaded video frame by frame, with questions at any time between plays. Live
during a play: the frame, vision tokens kept against encoded, KV entries, ingest latency per frame. Per
answer: latency, target passes (NFE), and on a task stream the ground truth."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import gradio as gr
import numpy as np
from PIL import Image

from demos.shared import SharedModel, choice, method_help, method_menu, number, parse_params, shown_on_page
from demos.video_tables import answer_table, history_table, notices, stream_table
from mmaccel.errors import InputError
from mmaccel.video.data import CLASSES, TEMPLATES, Stream, ask, make_stream
from mmaccel.video.frames import open_frames
from mmaccel.video.kv_reduce import QuestionPrune, RoundDecay
from mmaccel.video.reduce import SpatialMerge, TemporalDrop
from mmaccel.video.stream import FrameReport, VideoAnswer, VideoStreamPipeline
from mmaccel.video.train import CANVAS

TASK, UPLOAD = "task stream (held-out test images)", "video file"
SOURCES = (TASK, UPLOAD)
STREAM_FRAMES = 2000            # a task stream's length; its frames are rendered as they are played
FRAME_SIDE = CANVAS             # the built-in model's frames are 112 x 112: uploads are cropped and resized to it
DISPLAY_SCALE = 3               # the 112-px frame is shown 3x larger (nearest neighbour)
# vision token reduction at ingest (mmaccel.video.reduce) and at each question in the cache
# (mmaccel.video.kv_reduce), with the settings of `mmaccel bench video`; fresh reducers per stream
REDUCTIONS = {"none": lambda: None, "TemporalDrop (pixel)": lambda: [TemporalDrop("pixel")],
              "TemporalDrop + SpatialMerge": lambda: [TemporalDrop("pixel"), SpatialMerge(0.9)]}
KV_REDUCTIONS = {"QuestionPrune 25%": lambda: QuestionPrune(0.25), "RoundDecay 50%": lambda: RoundDecay(0.5)}
# every answer method of the pipeline; the settings of `mmaccel bench video` where it has them, editable on the page
# (the others start from their defaults). Methods that draft with the pipeline's draft get one that watches the
# stream: the model itself seeing only `draft keep` of each segment's vision tokens (SpecVLM), or its first layers.
REGISTRY = VideoStreamPipeline.methods()
METHODS = method_menu(REGISTRY)
DEFAULT_PARAMS = {"ar": "", "speculative": "k=2", "ngram": "k=2 max_ngram=2"}
DRAFT_KEEP = 0.1
# the speculative draft: the model itself (SpecVLM: it sees `draft keep` of the vision tokens) or its first
# layers (an early exit: LayerSkip-style self-speculation, as the `self-draft` rows of `mmaccel bench video`)
DRAFTS = {"the model itself": None, "its first layer (early exit)": 1, "its first two layers (early exit)": 2}
DRAFT = "the model itself"
MAX_PLAY = 240                  # frames per press of Play
UPDATE_EVERY = 4                # frames between live updates of a play (two temporal patches)
MAX_NEW_TOKENS = 12             # the task's longest answer is eight words ("bag up and coat left and shirt down")
WHEN = "when"                   # "tell me when a … appears ?": a proactive request, not a decoded answer
UPLOAD_NOTE = (f"Uploads are centre-cropped to a square and resized to {FRAME_SIDE}×{FRAME_SIDE}, the built-in "
               "model's frame size. Changing the source, a reduction, the draft or the file starts the stream over.")
IDLE = "*Press Play to start the stream.*"


def video_model(source: str, device: str | None = None) -> SharedModel:
    """The streaming model, loaded once; every session streams through its own pipeline over it."""
    def load() -> VideoStreamPipeline:
        pipe = VideoStreamPipeline.from_pretrained(source, device=device)
        warm = make_stream(0, 2 * pipe.model.temporal_patch, "test")     # warm-up: first-call costs stay out
        for t in range(warm.num_frames):                                  # of the first latencies shown
            pipe.feed(warm.frame(t))
        pipe.ask(TEMPLATES["now"], "ar", max_new_tokens=2)
        pipe.reset()
        return pipe

    return SharedModel("video", load)


@dataclass(frozen=True)
class Settings:
    """What a session's stream is built from: a change of any of these starts the stream over."""

    source: str
    seed: int | None            # a task stream's
    upload: str | None          # a video file's path, and the frame rate taken from it
    fps: float | None
    reduction: str
    kv_reduction: tuple[str, ...]
    draft_keep: float | None    # the draft's share of vision tokens; None: no draft (answers by ar or ngram)
    draft_exit: int | None = None   # the draft's early-exit layer count; None: the whole model


def drafted(method: str) -> bool:
    """Whether answer method `method` drafts with the pipeline's draft (its plug-in needs one)."""
    return method in REGISTRY and "draft" in REGISTRY[method].needs


def settings(source, seed, upload, fps, reduction, kv_reduction, method, draft_keep, draft=DRAFT) -> Settings:
    """The tab's controls, checked as the API may send anything."""
    source = choice(source, "source", SOURCES)
    kv_reduction = tuple(choice(k, "KV reduction", tuple(KV_REDUCTIONS)) for k in (kv_reduction or ()))
    method = choice(method, "method", METHODS)
    keep = number(draft_keep, "draft keep", 0, 1) if drafted(method) else None
    draft_exit = DRAFTS[choice(draft, "draft", tuple(DRAFTS))] if drafted(method) else None
    if source == TASK:
        task = number(seed, "seed", 0, 2**31 - 1, integer=True), None, None
    else:
        if not upload:
            raise InputError("no video: upload a file, or pick the task stream as the source")
        task = None, str(upload), number(fps, "frames per second", 0.5, 30)
    return Settings(source, *task, choice(reduction, "reduction", tuple(REDUCTIONS)),
                    tuple(k for k in KV_REDUCTIONS if k in kv_reduction), keep, draft_exit)


def fit_frame(pixels: np.ndarray, side: int = FRAME_SIDE) -> np.ndarray:
    """uint8 [H, W, 3] -> uint8 [side, side, 3]: the centre square, resized (bilinear, antialiased)."""
    h, w = pixels.shape[:2]
    s = min(h, w)
    square = np.ascontiguousarray(pixels[(h - s) // 2:(h - s) // 2 + s, (w - s) // 2:(w - s) // 2 + s])
    if s == side:
        return square
    return np.array(Image.fromarray(square).resize((side, side), Image.BILINEAR))


def _by_name(err: InputError, path: str) -> InputError:
    """The error with the upload named as the user knows it, not by the server's path."""
    return InputError(str(err).replace(path, Path(path).name))


class Session:
    """One browser session's stream: its own pipeline over the shared model (its own KV cache and reducers),
    the frame source, the running numbers of its plays, and the questions asked."""

    def __init__(self, base: VideoStreamPipeline, settings: Settings):
        self.settings = settings
        trigger = getattr(base, "trigger", None)        # proactive requests, where the model has a trigger head
        self.pipe = VideoStreamPipeline(
            base.model, base.tokenizer, budget=base.budget, max_answer_tokens=base.max_answer_tokens,
            system_prompt=base.system_prompt, reduction=REDUCTIONS[settings.reduction](),
            kv_reduction=[KV_REDUCTIONS[k]() for k in settings.kv_reduction],
            draft=None if settings.draft_keep is None else
            base.model if settings.draft_exit is None else base.model.early_exit(settings.draft_exit),
            draft_keep=settings.draft_keep or 0.0, **({"trigger": trigger} if trigger is not None else {}))
        self.stream: Stream | None = None
        self.frames = None
        if settings.source == TASK:
            self.stream = make_stream(settings.seed, STREAM_FRAMES, "test")
        else:
            try:                                         # a missing or non-video file is a clear InputError
                self.frames = open_frames(settings.upload, fps=settings.fps)
            except InputError as err:
                raise _by_name(err, settings.upload) from None
        self.frame: np.ndarray | None = None             # the last frame fed, as the model saw it
        self.last: FrameReport | None = None
        self.kept = self.encoded = 0
        self.ingest_s = 0.0
        self.ended = False
        self.notices: list[str] = []                     # proactive requests that fired
        self.expected: dict[int, int | None] = {}        # request id -> the frame its subject truly enters (task)
        self.history: list[tuple[VideoAnswer, str]] = []

    @property
    def frames_seen(self) -> int:
        return self.pipe.frames_seen

    def feed_next(self) -> bool:
        """Feed the source's next frame; False at its end."""
        if self.stream is not None:
            if self.frames_seen >= self.stream.num_frames:
                self.ended = True
                return False
            pixels = self.stream.frame(self.frames_seen).numpy()
        else:
            try:
                frame = next(self.frames, None)
            except InputError as err:                    # undecodable data, no frames at all, a size change
                raise _by_name(err, self.settings.upload) from None
            if frame is None:
                self.ended = True
                return False
            pixels = fit_frame(frame.pixels.numpy())
        report = self.pipe.feed(pixels)
        self.frame, self.last = pixels, report
        self.kept, self.encoded = self.kept + report.vision_tokens, self.encoded + report.tokens_in
        self.ingest_s += report.ingest_s
        for event in getattr(report, "events", ()):                 # proactive requests that fired
            truth = ""
            if event.request_id in self.expected:
                expected = self.expected[event.request_id]
                truth = " (truth: none enters)" if expected is None else f" (truth: one entered at frame {expected})"
            self.notices.append(f"frame {event.frame}: a **{event.subject}** appeared "
                                f"(p = {event.probability:.2f}, asked after frame {event.requested_at}){truth}")
        return True

    def close(self) -> None:
        if self.frames is not None:
            self.frames.close()


def _close(session: Session | None) -> None:
    """gr.State's delete callback: a closed page stops its file's decoder thread."""
    if session is not None:
        session.close()


def _question_kind(question: str) -> tuple[str, str | None] | None:
    """(kind, subject) of a question written as one of the task's templates, else None."""
    text = " ".join(question.lower().replace("?", " ?").split())       # as the word tokenizer splits it
    for kind, template in TEMPLATES.items():
        match = re.fullmatch(re.escape(template).replace(re.escape("{}"), r"(\S+)"), text)
        if match:
            return kind, match.group(1) if match.groups() else None
    return None


def ground_truth(session: Session, question: str) -> str:
    """The task's answer to `question` at the last frame fed, or why there is none."""
    if session.stream is None:
        return "– (a video file has no ground truth)"
    parsed = _question_kind(question)
    if parsed is None:
        return "– (only the task's question templates have one)"
    kind, subject = parsed
    if subject is not None and subject not in CLASSES:
        return f"– ({subject!r} is not a Fashion-MNIST class: {', '.join(CLASSES)})"
    truth = ask(session.stream, session.frames_seen - 1, kind, subject)
    if truth is None:
        if kind == "count":
            return "– (more items have appeared than the task counts)"
        return f"– (the question needs exactly one {subject} on screen)"
    return truth.answer


def suggest(template: str | None, session: Session | None) -> str:
    """A template as a question, its subject picked so that it is well defined at the current frame."""
    if not template:
        return gr.skip()
    if "{}" not in template:
        return template
    shown = []
    if session is not None and session.stream is not None and session.frames_seen:
        shown = [t.class_name for t in session.stream.on_screen(session.frames_seen - 1)]
    if template == TEMPLATES[WHEN]:
        options = [c for c in CLASSES if c not in shown]
    else:
        options = [c for c in dict.fromkeys(shown) if shown.count(c) == 1]
    return template.format(options[0] if options else "bag")


def request_notice(session: Session, subject: str | None) -> str:
    """ "tell me when a … appears ?" registers a proactive request on the model's trigger head."""
    if getattr(session.pipe, "trigger", None) is None or not hasattr(session.pipe, "request"):
        raise InputError("this model has no trigger head, so it cannot watch for items ('tell me when …' "
                         "questions); ask about what it has seen instead")
    request = session.pipe.request(subject)          # a subject the head does not know is a clear InputError
    text = f"Watching for a **{subject}** after frame {session.frames_seen - 1}: press Play; a notice appears " \
           "when the model sees one."
    if session.stream is not None and subject in CLASSES:
        entry = ask(session.stream, session.frames_seen - 1, WHEN, subject)
        if entry is None:
            text += f" Ground truth: – (a {subject} is on screen now; the request fires once one comes back)."
        else:
            session.expected[request.request_id] = entry.trigger_frame
            text += " Ground truth: " + (f"one enters at frame {entry.trigger_frame}." if entry.trigger_frame
                                         is not None else "none enters in this stream.")
    return text


def build(model: SharedModel) -> None:
    """The tab's controls and events (call inside a gr.Blocks / gr.Tab)."""
    session = gr.State(None, delete_callback=_close)
    with gr.Row():
        with gr.Column(scale=1):
            source = gr.Radio(list(SOURCES), value=TASK, label="source", elem_id="video-source")
            seed = gr.Number(0, precision=0, minimum=0, label="task stream seed", elem_id="video-seed")
            upload = gr.Video(sources=["upload"], label="video file", elem_id="video-upload", visible=False)
            fps = gr.Slider(0.5, 30, value=4, step=0.5, label="frames per second taken from the file", visible=False)
            gr.Markdown(UPLOAD_NOTE)
            reduction = gr.Dropdown(list(REDUCTIONS), value="none", label="vision token reduction at ingest",
                                    elem_id="video-reduction")
            kv_reduction = gr.CheckboxGroup(list(KV_REDUCTIONS), value=[], label="KV reduction at each question",
                                            elem_id="video-kv")
            method = gr.Dropdown(list(METHODS), value="speculative", label="answer method", elem_id="video-method")
            params = gr.Textbox(DEFAULT_PARAMS["speculative"], label="method parameters (KEY=VALUE)")
            about = gr.Markdown(method_help(REGISTRY["speculative"]), elem_id="video-method-help")
            draft_keep = gr.Slider(0, 1, value=DRAFT_KEEP, step=0.05, elem_id="video-draft-keep",
                                   label="draft keep (share of vision tokens the draft sees; 0 = text only)")
            draft = gr.Dropdown(list(DRAFTS), value=DRAFT, label="draft", elem_id="video-draft")
        with gr.Column(scale=2):
            with gr.Row():
                play_n = gr.Slider(2, MAX_PLAY, value=32, step=2, label="frames per play", elem_id="video-frames")
                play = gr.Button("Play N frames", variant="primary", elem_id="video-play")
                restart = gr.Button("Restart the stream", elem_id="video-restart")
            with gr.Row():
                frame = gr.Image(label="current frame", format="png", interactive=False, elem_id="video-frame",
                                 height=FRAME_SIDE * DISPLAY_SCALE)
                stats = gr.Markdown(IDLE, elem_id="video-stats")
            fired = gr.Markdown(elem_id="video-notices")
            with gr.Row():
                template = gr.Dropdown([(t.replace("{}", "…"), t) for t in TEMPLATES.values()], value=None,
                                       label="question template", elem_id="video-template")
                question = gr.Textbox(TEMPLATES["now"], label="question", elem_id="video-question")
                ask_button = gr.Button("Ask", variant="primary", elem_id="video-ask")
            answer = gr.Markdown(elem_id="video-answer")
            history = gr.Markdown(elem_id="video-history")

    options = [source, seed, upload, fps, reduction, kv_reduction, method, draft_keep, draft]
    views = [frame, stats, fired, answer, history]
    cleared = (None, IDLE, "", "", "")

    @shown_on_page
    def restart_if_changed(current, *controls):
        try:
            wanted = settings(*controls)
        except InputError:
            wanted = None
        if current is not None and current.settings == wanted:
            return (gr.skip(),) * (1 + len(views))
        _close(current)
        return None, *cleared

    @shown_on_page
    def restart_stream(current):
        _close(current)
        return None, *cleared

    @shown_on_page
    def play_frames(current, source, seed, upload, fps, reduction, kv_reduction, method, draft_keep, draft, count,
                    progress=gr.Progress()):
        wanted = settings(source, seed, upload, fps, reduction, kv_reduction, method, draft_keep, draft)
        count = number(count, "frames per play", 1, MAX_PLAY, integer=True)
        progress(0.0, desc="loading the video model")
        with model.use() as base:
            if current is None or current.settings != wanted:
                _close(current)
                current = Session(base, wanted)
        played = 0
        while played < count and not current.ended:
            with model.use():                        # released between updates: other sessions interleave
                for _ in range(min(UPDATE_EVERY, count - played)):
                    if not current.feed_next():
                        break
                    played += 1
            progress(played / count, desc=f"frame {current.frames_seen}")
            yield current, _shown(current.frame), stream_table(current), notices(current)
        if played == 0:
            raise InputError(f"the source has ended after {current.frames_seen} frames: restart the stream, or pick "
                             "another seed or file")

    @shown_on_page
    def answer_question(current, question, method, params_text, progress=gr.Progress()):
        method = choice(method, "method", METHODS)
        params = parse_params(params_text)
        if not isinstance(question, str) or not question.strip():
            raise InputError("the question is empty: type one, or pick a template")
        if current is None or current.frames_seen == 0:
            raise InputError("no frame has been played yet: press Play, then ask about what the model has seen")
        if drafted(method) and current.pipe.draft is None:
            raise InputError(f"{method} answers need a draft that has watched the stream: choose the method "
                             "before playing (changing it restarts the stream)")
        progress(0.0, desc="answering")
        parsed = _question_kind(question)
        with model.use():
            if parsed is not None and parsed[0] == WHEN:
                return request_notice(current, parsed[1]), history_table(current), stream_table(current)
            reply = current.pipe.ask(question, method, max_new_tokens=MAX_NEW_TOKENS, **params)
        truth = ground_truth(current, question)
        current.history.append((reply, truth))
        return answer_table(reply, method, truth), history_table(current), stream_table(current)

    gr.on([control.change for control in options], restart_if_changed, [session, *options], [session, *views],
          queue=False, api_visibility="private")
    source.change(lambda s: [gr.update(visible=s == TASK)] + [gr.update(visible=s == UPLOAD)] * 2, source,
                  [seed, upload, fps], queue=False)
    method.change(lambda m: [DEFAULT_PARAMS.get(m, ""), method_help(REGISTRY[m]) if m in REGISTRY else "",
                             *[gr.update(visible=drafted(m))] * 2], method, [params, about, draft_keep, draft],
                  queue=False)
    template.change(suggest, [template, session], question, queue=False)
    restart.click(restart_stream, session, [session, *views], queue=False)
    play.click(play_frames, [session, *options, play_n], [session, frame, stats, fired], api_name="video_play")
    gr.on([ask_button.click, question.submit], answer_question, [session, question, method, params],
          [answer, history, stats], api_name="video_ask")


def _shown(frame: np.ndarray | None) -> Image.Image | None:
    if frame is None:
        return None
    image = Image.fromarray(frame)
    return image.resize((image.width * DISPLAY_SCALE, image.height * DISPLAY_SCALE), resample=Image.NEAREST)
