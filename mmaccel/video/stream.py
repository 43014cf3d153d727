"""VideoStreamPipeline: frames in one by one, questions at any time, answers decoded by any core method a stream
can run (`mmaccel.video.methods`).

>>> pipe = VideoStreamPipeline(QwenVLStream(hf_model), tokenizer)
>>> for frame in open_frames("clip.mp4", fps=2):
...     pipe.feed(frame)
>>> pipe.ask("what is on screen now ?").text

The stream lives in one KV cache (B = 1) whose size is fixed when the pipeline is made: the
`KVBudget` (sinks + vision window + text window) plus room for one answer. Frames are grouped into the
model's temporal patches and appended as vision segments; a question flushes a partly filled patch
(its last frame repeated, as the model's processor pads), is appended as text, and the answer is
decoded from there by the chosen method and stays in the cache, so later questions see it.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from mmaccel.core.methods import Method, Resources
from mmaccel.core.plugin import MethodPlugin
from mmaccel.core.sampling import Sampling
from mmaccel.core.stats import DecodeStats
from mmaccel.errors import InputError, ModelNotFoundError, check
from mmaccel.video.kv_reduce import append_question, as_kv_reducers, vision_tokens
from mmaccel.video.memory import TEXT, VISION, KVBudget, evict, plan_eviction
from mmaccel.video.methods import VIDEO_REGISTRY, build_video_method
from mmaccel.video.models import QWEN_TURNS, ChatTurns, chat_turns, load_stream_model, stream_model
from mmaccel.video.qwen_vl import QwenVLStream
from mmaccel.video.reduce import Segment, as_reducers, reduce_segment
from mmaccel.video.trigger import TriggerEvent, TriggerHead, TriggerMonitor, TriggerRequest, has_trigger, load_trigger

ANSWER_ROOM = 64        # cache entries beyond the answer for draft blocks (2 × (width + 1), width <= 31)
BUILTIN = "builtin:moving-fashion"
BUILTIN_DIR = "video_qwen"  # under mmaccel/assets/: a Hugging Face directory + words.json


@dataclass
class FrameReport:
    """What one fed frame cost and left behind."""

    index: int                  # frames fed so far - 1
    appended: bool              # whether this frame completed a temporal patch (a segment entered the cache)
    vision_tokens: int          # vision tokens of the segment that entered the cache (0 if none)
    tokens_in: int              # vision tokens the encoder gave for it, before reduction (0 if none)
    kv_entries: int             # cache entries after this frame
    ingest_s: float             # wall time of this feed (encode + append + eviction)
    events: list[TriggerEvent] = field(default_factory=list)   # proactive requests that fired (`request`)


@dataclass
class VideoAnswer:
    """One answer of `VideoStreamPipeline.ask`: the question, the answer's text (end-of-turn token left out) and
    tokens, the frames fed before it was asked, the decode statistics and the seconds from the question to its
    answer, with the vision tokens in the cache when the question came and after the pipeline's KV reduction."""

    question: str
    text: str
    tokens: list[int]
    frames_seen: int
    stats: DecodeStats
    latency_s: float            # question appended + answer decoded
    vision_entries_before: int = 0      # vision tokens in the cache when the question came (marks not counted)
    vision_entries_after: int = 0       # and after the pipeline's kv_reduction (the answer decoded over these)


class _Continuation:
    """The stream's model as the core decode loop sees it for one answer: its `prefill` appends the
    question to the live stream state instead of starting a new one, then applies the KV reducers
    (`mmaccel.video.kv_reduce`): the first token's logits come from the full cache, the loop goes on
    from the reduced one."""

    def __init__(self, model: QwenVLStream, state, kv_reduction=(), draft: _Continuation | None = None):
        self.model, self.state, self.kv_reduction, self.draft = model, state, list(kv_reduction), draft

    def __getattr__(self, name):
        return getattr(self.model, name)

    def early_exit(self, exit_layer: int, head=None) -> _Continuation:
        """The core's `early-exit` method asks the target for its early-exit view: in a stream that is the
        pipeline's draft, which has watched the stream, when it is this model's exit at `exit_layer`."""
        exit_at = None if self.draft is None else self.draft.model.exit_layer
        check(exit_at == exit_layer and self.model.shares_vision(self.draft.model),
              f"early-exit answers at layer {exit_layer} need a pipeline whose draft watched the stream at that exit: "
              f"VideoStreamPipeline(model, ..., draft=model.early_exit({exit_layer}), draft_keep=1.0)")
        check(head is None, "a streaming model's early exit reads out through the model's own norm and head")
        return self.draft

    def prefill(self, inputs: list[list[int]], room: int):
        check(len(inputs) == 1, "a stream answers one question at a time")
        free = self.state.cache.capacity - int(self.state.cache.lengths[0]) - len(inputs[0])
        check(free >= room, f"the answer needs {room} cache entries, {free} are free: lower max_new_tokens or "
              "raise max_answer_tokens")
        self.state.logits = append_question(self.model, self.state, list(inputs[0]), self.kv_reduction)
        return self.state

    def step(self, state, tokens: Tensor, positions: Tensor | None = None, tree_mask: Tensor | None = None) -> Tensor:
        return self.model.step(state, tokens, positions, tree_mask)


class VideoStreamPipeline:
    """A streaming video-language model with bounded memory. `tokenizer` maps a question to its token
    ids (`question_ids`) and answer ids back to text (`decode`), with `eos_token_id`."""

    def __init__(self, model: QwenVLStream, tokenizer, *, budget: KVBudget | None = None,
                 max_answer_tokens: int = 64, system_prompt: list[int] | None = None, reduction=None,
                 draft: QwenVLStream | None = None, draft_keep: float = 0.1, trigger: TriggerHead | None = None,
                 kv_reduction=None):
        check(isinstance(max_answer_tokens, int) and max_answer_tokens >= 1,
              f"max_answer_tokens must be an int >= 1, got {max_answer_tokens!r}")
        self.model, self.tokenizer = model, tokenizer
        self.budget = budget or KVBudget()
        check(isinstance(self.budget, KVBudget), f"budget must be a KVBudget, got {type(self.budget).__name__}")
        self.max_answer_tokens = max_answer_tokens
        self.capacity = self.budget.total + max_answer_tokens + ANSWER_ROOM
        self.system_prompt = list(system_prompt or [])
        self.reduction = as_reducers(reduction)
        self.kv_reduction = as_kv_reducers(kv_reduction, model)     # at each question, on the cache
        if trigger is not None:
            check(isinstance(trigger, TriggerHead), f"trigger must be a TriggerHead, got {type(trigger).__name__}")
            hidden = model.text.config.hidden_size
            check(trigger.hidden_size == hidden, f"the trigger head reads hidden states of size {trigger.hidden_size}, "
                  f"the model's are {hidden}: train a head for this model (python -m mmaccel.video.train_trigger)")
            trigger = trigger.to(model.device).eval()
        self.trigger = trigger
        check(isinstance(draft_keep, (int, float)) and 0.0 <= draft_keep <= 1.0,
              f"draft_keep must be a share of vision tokens in [0, 1], got {draft_keep!r}")
        self.draft, self.draft_keep = draft, float(draft_keep)
        self.reset()

    @classmethod
    def from_pretrained(cls, name_or_path: str = BUILTIN, *, device: str | torch.device | None = None,
                        dtype: str | torch.dtype | None = torch.float32, budget: KVBudget | None = None,
                        max_answer_tokens: int = 64, cuda_graphs: bool = False, reduction=None,
                        kv_reduction=None) -> VideoStreamPipeline:
        """`"builtin:moving-fashion"` (the shipped Qwen2.5-VL trained on the moving Fashion-MNIST streams)
        or a local Qwen2-VL / Qwen2.5-VL / SmolVLM / Idefics3 directory: with `words.json` (a word-level
        vocabulary, our format) or a Hugging Face tokenizer, whose chat format wraps each question."""
        from mmaccel.devices import resolve_device, resolve_dtype, use_cuda_graphs
        from mmaccel.paths import assets_dir

        device = resolve_device(device)
        dtype = resolve_dtype(dtype, device)
        use_cuda_graphs(cuda_graphs, device)
        if name_or_path == BUILTIN:
            path = assets_dir() / BUILTIN_DIR
            if not (path / "config.json").is_file():
                raise ModelNotFoundError(f"the built-in streaming model is not in {path}: train and export it with "
                                         "`python -m mmaccel.video.train` (docs/models.md)")
        elif name_or_path.startswith("builtin:"):
            raise ModelNotFoundError(f"unknown built-in model {name_or_path!r}; the built-in video model is {BUILTIN!r}")
        else:
            path = Path(name_or_path)
            if not path.is_dir():
                raise ModelNotFoundError(f"no model directory at {path}")
        hf = load_stream_model(path, dtype).to(device)
        tokenizer = load_tokenizer(path, chat_turns(hf.config.model_type))
        model = stream_model(hf, getattr(tokenizer, "tokenizer", None))
        use_cuda_graphs(cuda_graphs, device, model)
        words = getattr(tokenizer, "tokens", None)
        if words is not None:
            ours = (len(words), tokenizer.vision_start, tokenizer.vision_end, tokenizer.video)
            theirs = (model.vocab_size, model.vision_start, model.vision_end, model.video_token)
            check(ours == theirs, f"{path}/words.json does not match the model: vocabulary size and vision token "
                  f"ids {ours} against the config's {theirs}")
        trigger = load_trigger(path, model.text.config.hidden_size) if has_trigger(path) else None
        return cls(model, tokenizer, budget=budget, max_answer_tokens=max_answer_tokens, reduction=reduction,
                   trigger=trigger, kv_reduction=kv_reduction)

    # ---- the stream ------------------------------------------------------------------------------

    def reset(self) -> None:
        """Start a new stream (the cache is emptied, the system prompt appended again)."""
        self.state = self.model.new_state(1, self.capacity)
        self.draft_state = None if self.draft is None else self.draft.new_state(1, self.capacity)
        self.frames_seen = 0
        self.size: tuple[int, int] | None = None
        self._pending: list[Tensor] = []
        self._monitor = None if self.trigger is None else TriggerMonitor(self.trigger.classes, self.trigger.threshold)
        self._events: list[TriggerEvent] = []       # fired since the last FrameReport
        for reducer in (*self.reduction, *self.kv_reduction):
            reducer.reset()
        if self.system_prompt:
            check(len(self.system_prompt) <= self.budget.sink + self.budget.text,
                  "the system prompt is longer than the KV budget's sink + text entries")
            self.model.append_text(self.state, self.system_prompt)
            if self.draft is not None:
                self.draft.append_text(self.draft_state, self.system_prompt)

    @property
    def kv_entries(self) -> int:
        """Cache entries the stream holds now (system prompt, vision segments, questions and answers)."""
        return int(self.state.cache.lengths[0])

    def feed(self, frame) -> FrameReport:
        """Take one frame (uint8 [H, W, 3], a `Frame`, or anything `mmaccel.video.frames` accepts)."""
        t0 = time.perf_counter()
        pixels = _pixels(frame)
        if self.size is None:
            m = self.model.frame_multiple
            check(pixels.shape[0] % m == 0 and pixels.shape[1] % m == 0,
                  f"frames are {pixels.shape[0]}x{pixels.shape[1]}; this model needs sides that are multiples of {m}")
            self.size = tuple(pixels.shape[:2])
        elif tuple(pixels.shape[:2]) != self.size:
            raise InputError(f"frame {self.frames_seen} is {pixels.shape[0]}x{pixels.shape[1]}, the stream's frames are "
                             f"{self.size[0]}x{self.size[1]}: a stream keeps one frame size (reset() to start another)")
        self._pending.append(pixels)
        self.frames_seen += 1
        kept, tokens_in = self._flush() if len(self._pending) == self.model.temporal_patch else (0, 0)
        events, self._events = self._events, []
        return FrameReport(self.frames_seen - 1, tokens_in > 0, kept, tokens_in, self.kv_entries,
                           time.perf_counter() - t0, events)

    def watch(self, source, *, fps: float | None = None, source_fps: float | None = None) -> Iterator[FrameReport]:
        """Feed every frame of `source` (a video file, an array, an iterator: `mmaccel.video.frames.open_frames`),
        yielding each frame's report; ask questions between yields."""
        from mmaccel.video.frames import open_frames

        with open_frames(source, fps=fps, source_fps=source_fps) as frames:
            for frame in frames:
                yield self.feed(frame)

    def _flush(self) -> tuple[int, int]:
        """Append the pending frames as one vision segment, reduced by the pipeline's reducers; returns
        (vision tokens kept, vision tokens encoded)."""
        if not self._pending:
            return 0, 0
        frames = torch.stack(self._pending)
        self._pending = []
        embeds, grid = self.model.encode(frames)
        segment = reduce_segment(self.reduction, Segment(frames, embeds, self.model.token_grid(grid)))
        kept = int(segment.keep.sum())
        self._make_room(kept + self.model.segment_marks, VISION)
        positions, nxt = self.model.segment_positions(self.state.extras["next_position"], grid)
        keep = None if kept == embeds.shape[0] else segment.keep
        self.model.append_segment(self.state, segment.embeds, positions, nxt, keep=keep)
        if self._monitor is not None:                 # state.hidden: [1, markers + kept tokens, d]
            opened, closed = len(self.model.segment_open), len(self.model.segment_close)
            probabilities = self.trigger.probabilities(self.state.hidden[0, opened:self.state.hidden.shape[1] - closed])
            self._events += self._monitor.observe(probabilities, self.frames_seen - 1)
        if self.draft is not None:
            self._feed_draft(frames, segment, grid)
        return kept, embeds.shape[0]

    def _feed_draft(self, frames: Tensor, segment: Segment, grid) -> None:
        """The draft's view of a segment (SpecVLM): `draft_keep` of the tokens the target kept, evenly
        spread over them; none at all with draft_keep = 0 (a text-only draft)."""
        if self.draft_keep == 0.0:
            return
        draft, state = self.draft, self.draft_state
        embeds, keep = segment.embeds, segment.keep
        if not self.model.shares_vision(draft):          # another model: its own encoder and token grid
            embeds, grid = draft.encode(frames)
            keep = torch.ones(embeds.shape[0], dtype=torch.bool)
        survivors = keep.nonzero()[:, 0].cpu()
        count = min(len(survivors), max(1, math.ceil(self.draft_keep * len(survivors) - 1e-9)))
        mask = torch.zeros(embeds.shape[0], dtype=torch.bool)
        if count:
            mask[survivors[torch.linspace(0, len(survivors) - 1, count).round().long()]] = True
        self._make_room(count + draft.segment_marks, VISION, draft, state)
        positions, nxt = draft.segment_positions(state.extras["next_position"], grid)
        draft.append_segment(state, embeds, positions, nxt, keep=mask)

    def _make_room(self, incoming: int, kind: int, model=None, state=None) -> None:
        """Evict from the stream's cache (or the draft's: `model`, `state`) so `incoming` entries fit the budget."""
        model, state = (self.model, self.state) if model is None else (model, state)
        units = state.extras["units"]
        keep = plan_eviction(units, self.budget, incoming, kind)
        if keep is not None:
            position = evict(state, units, keep, model.rotate_keys)
            model.move_to(state, position)

    @staticmethod
    def _rewind(model, state, length: int, next_position: int) -> None:
        state.cache.rollback(int(state.cache.lengths[0]) - length)
        state.extras["units"].truncate(length)
        model.move_to(state, next_position)

    # ---- proactive requests ----------------------------------------------------------------------

    def request(self, subject: str) -> TriggerRequest:
        """Register "tell me when a `subject` appears": the request fires once, at the first segment after
        now where the trigger head sees a new appearance of `subject` (one of `trigger.classes`), reported
        in that frame's `FrameReport.events` (a segment flushed by `ask` reports in the next frame's). A
        subject already seen now fires only after it has gone and come back (`mmaccel.video.trigger`)."""
        if self._monitor is None:
            raise InputError("this pipeline has no trigger head: pass trigger=TriggerHead (load_trigger(DIR)) or "
                             "train one into the model directory with `python -m mmaccel.video.train_trigger`")
        return self._monitor.request(subject, self.frames_seen - 1)

    @property
    def requests(self) -> list[TriggerRequest]:
        """The proactive requests still waiting."""
        return [] if self._monitor is None else list(self._monitor.pending)

    # ---- questions -------------------------------------------------------------------------------

    @staticmethod
    def methods() -> dict[str, MethodPlugin]:
        """The answer methods `ask` takes: name -> plug-in (parameters, exactness, needs)."""
        return VIDEO_REGISTRY

    def ask(self, question: str, method: str | Method = "ar", *, max_new_tokens: int = 32, temperature: float = 0.0,
            top_k: int = 0, top_p: float = 1.0, seed: int = 0, **method_params) -> VideoAnswer:
        """Answer `question` from everything seen so far; the answer joins the stream's history. `method`: a name
        from `VideoStreamPipeline.methods()` or a Method; `method_params` configure it (k, depth, window, ...)."""
        check(isinstance(question, str) and question.strip() != "", "the question must be a non-empty string")
        check(self.frames_seen > 0, "no frame has been fed yet: feed frames before asking about them")
        check(isinstance(max_new_tokens, int) and 1 <= max_new_tokens <= self.max_answer_tokens,
              f"max_new_tokens must be in [1, {self.max_answer_tokens}] (the pipeline's max_answer_tokens), "
              f"got {max_new_tokens!r}")
        built = build_video_method(method, **method_params)
        check(self.draft is not None or "draft" not in built.needs,
              f"method {built.name!r} drafts with a draft that has watched the stream, and this pipeline has none: "
              "make it with VideoStreamPipeline(model, ..., draft=model, draft_keep=0.1) (SpecVLM) or "
              "draft=model.early_exit(k), draft_keep=1.0")
        sampling = Sampling(temperature=temperature, top_k=top_k, top_p=top_p)
        t0 = time.perf_counter()
        self._flush()
        ids = list(self.tokenizer.question_ids(question))
        self._make_room(len(ids) + max_new_tokens, TEXT)
        before = vision_tokens(self.model, self.state)
        draft = None
        if self.draft is not None:
            self._make_room(len(ids) + max_new_tokens, TEXT, self.draft, self.draft_state)
            mark = (int(self.draft_state.cache.lengths[0]), self.draft_state.extras["next_position"])
            draft = _Continuation(self.draft, self.draft_state)
        resources = Resources(model=_Continuation(self.model, self.state, self.kv_reduction, draft), draft=draft)
        gen = built.run(resources, [ids], max_new_tokens=max_new_tokens, sampling=sampling, seed=seed,
                        eos_token_id=self.tokenizer.eos_token_id, prompt_tokens=[ids])
        tokens = gen.tokens[0]
        self.model.commit_text(self.state, tokens)
        if self.draft is not None:                      # the draft keeps the question and the answer, not its guesses
            self._rewind(self.draft, self.draft_state, *mark)
            self.draft.append_text(self.draft_state, ids + list(tokens))
        text = self.tokenizer.decode([t for t in tokens if t != self.tokenizer.eos_token_id])
        return VideoAnswer(question, text, tokens, self.frames_seen, gen.stats, time.perf_counter() - t0,
                           before, vision_tokens(self.model, self.state))


def _pixels(frame) -> Tensor:
    """A frame as uint8 [H, W, 3] on the host."""
    pixels = getattr(frame, "pixels", frame)
    if not isinstance(pixels, Tensor):
        try:
            pixels = torch.as_tensor(__import__("numpy").asarray(pixels))
        except (TypeError, ValueError):
            raise InputError(f"a frame must be an [H, W, 3] uint8 array or tensor, got {type(frame).__name__}") from None
    check(pixels.dim() == 3 and pixels.shape[-1] == 3 and pixels.dtype == torch.uint8,
          f"a frame must be uint8 [H, W, 3], got {pixels.dtype} {tuple(pixels.shape)}")
    return pixels.cpu()


class ChatTokenizer:
    """A Hugging Face tokenizer with its family's chat turns (Qwen's by default): a question closes the user
    turn the frames were in and opens the assistant's; the answer ends with the end-of-turn token, and the
    next frames open a new user turn (`resume_ids`)."""

    def __init__(self, tokenizer, turns: ChatTurns = QWEN_TURNS):
        self.tokenizer, self.turns = tokenizer, turns
        self.eos_token_id = tokenizer.convert_tokens_to_ids(turns.end) if turns.end in tokenizer.get_vocab() \
            else tokenizer.eos_token_id

    def question_ids(self, text: str) -> list[int]:
        """Token ids of `text` closing the user turn, then the opening of the assistant's turn."""
        return self.tokenizer(f"{text}{self.turns.end}{self.turns.assistant}", add_special_tokens=False)["input_ids"]

    def resume_ids(self) -> list[int]:
        """Token ids that open a new user turn, for the frames that follow an answer."""
        return self.tokenizer(self.turns.user, add_special_tokens=False)["input_ids"]

    def decode(self, ids: list[int]) -> str:
        """The text of answer ids, special tokens skipped and surrounding whitespace stripped."""
        return self.tokenizer.decode(ids, skip_special_tokens=True).strip()


def load_tokenizer(path: Path, turns: ChatTurns = QWEN_TURNS):
    """`words.json` (the built-in word vocabulary) or the directory's Hugging Face tokenizer with `turns`."""
    from mmaccel.video.words import WordTokenizer

    words = path / "words.json"
    if words.is_file():
        try:
            return WordTokenizer(json.loads(words.read_text()))
        except (json.JSONDecodeError, TypeError) as e:
            raise ModelNotFoundError(f"{words} is not a JSON list of words: {e}") from None
    from transformers import AutoTokenizer

    try:
        return ChatTokenizer(AutoTokenizer.from_pretrained(path, local_files_only=True), turns)
    except (OSError, ValueError) as e:
        raise ModelNotFoundError(f"{path} has neither words.json nor a Hugging Face tokenizer: {e}") from None
