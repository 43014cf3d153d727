"""Streaming-video task on real images: Fashion-MNIST items crossing a dark canvas, and questions about them.

A tiny video-language model is trained and evaluated on these streams, so everything here is chosen to
make exact-match answers well defined:

- Each object is one Fashion-MNIST image (28x28, grey, tinted per object so two shirts differ). It enters
  at one edge, moves straight across at a constant integer speed (1-3 px per frame) in one of four
  directions, and leaves at the opposite edge. Objects never overlap: a new object's whole path is checked
  against every object still on screen before it is placed, so each visible item is fully recognisable and
  "left to right" is unambiguous.
- At most `max_on_screen` objects are visible at once; a new one waits (its entry is delayed) while the
  screen is full. Gaps between entries are geometric with mean `mean_gap` frames, so the screen is
  sometimes empty.
- The background is a fixed per-stream texture: a pixel no object covers is identical in every frame,
  which is what token-dropping methods that compare frames rely on.
- A stream's split decides its images: "test" streams only show Fashion-MNIST test images, so an
  evaluation stream never shows an image seen in training.

Frames are rendered on demand (`Stream.frame(t)`, iteration), so a 10 000-frame stream costs only its
track list and one 28x28x3 sprite per object. Same seed, same stream.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cache

import numpy as np
import torch
from torch import Tensor

from mmaccel.errors import check
from mmaccel.image.data import load_fashion_mnist

# Fashion-MNIST labels 0..9 as one lower-case word each (a word-level tokenizer sees one token per class).
CLASSES: tuple[str, ...] = ("t-shirt", "trouser", "pullover", "dress", "coat",
                            "sandal", "shirt", "sneaker", "bag", "boot")
DIRECTIONS = ("left", "right", "up", "down")
SPLITS = ("train", "test")
KINDS = ("now", "before", "count", "direction", "when", "describe")
NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
                "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen",
                "nineteen", "twenty")
OBJECT_SIZE = 28
SPEEDS = (1, 2, 3)

# "?" is its own word, so `text.split()` is the whole tokenization of a question.
TEMPLATES = {
    "now": "what is on screen now ?",
    "before": "what appeared before the {} ?",
    "count": "how many items have appeared so far ?",
    "direction": "which way is the {} moving ?",
    "when": "tell me when a {} appears ?",
    "describe": "where is everything going ?",
}
_ANSWER_WORDS = ("nothing", "and")
VOCAB: tuple[str, ...] = tuple(dict.fromkeys(
    [*CLASSES, *DIRECTIONS, *NUMBER_WORDS, *_ANSWER_WORDS]
    + [w for text in TEMPLATES.values() for w in text.split() if w != "{}"]))

_PLACEMENT_TRIES = 8  # random motions tried at one entry frame before the entry is delayed by a frame
_BACKGROUND_MAX = 24  # background pixels are in [0, _BACKGROUND_MAX): dark, a little texture


@cache
def _split_arrays(split: str) -> tuple[np.ndarray, np.ndarray]:
    """Fashion-MNIST `split` -> (images uint8 [N, 28, 28], labels int64 [N]), loaded once per process."""
    images, labels = load_fashion_mnist(split)
    return images.numpy(), labels.numpy()


def _top_left(direction: str, speed: int, lane: int, enter_frame: int, canvas: int, t):
    """Top-left corner (x, y) at frame(s) `t` (int or integer array).

    `travelled` is how far the leading edge has come onto the canvas: `speed` px at `enter_frame`
    (the first frame with a pixel on screen), `canvas + OBJECT_SIZE` or more once fully out."""
    travelled = speed * (t - enter_frame + 1)
    if direction == "right":
        return travelled - OBJECT_SIZE, lane
    if direction == "left":
        return canvas - travelled, lane
    if direction == "down":
        return lane, travelled - OBJECT_SIZE
    return lane, canvas - travelled  # up


@dataclass(frozen=True)
class Track:
    """One object's path: image `image_index` of the stream's split (class `label`, an index into CLASSES),
    moving `direction` at `speed` px per frame along row/column `lane` (its top/left coordinate across the
    motion), first visible at `enter_frame`. `tint` scales the grey image per RGB channel (its largest
    entry is 1). `leave_frame`, the first frame with no pixel on the canvas, follows from the rest."""

    object_id: int
    label: int
    image_index: int
    direction: str
    speed: int
    lane: int
    enter_frame: int
    tint: tuple[float, float, float] = (1.0, 1.0, 1.0)
    canvas: int = 112
    leave_frame: int = field(init=False)

    def __post_init__(self):
        check(self.direction in DIRECTIONS, f"direction must be one of {DIRECTIONS}, got {self.direction!r}")
        check(isinstance(self.speed, int) and self.speed >= 1, f"speed must be a positive int, got {self.speed!r}")
        check(0 <= self.label < len(CLASSES), f"label must be a class index in [0, {len(CLASSES)}), got {self.label}")
        check(self.canvas >= OBJECT_SIZE, f"canvas must be at least {OBJECT_SIZE} px, got {self.canvas}")
        check(0 <= self.lane <= self.canvas - OBJECT_SIZE,
              f"lane must be in [0, {self.canvas - OBJECT_SIZE}] so the object fits across the canvas, got {self.lane}")
        check(self.enter_frame >= 0, f"enter_frame must be >= 0, got {self.enter_frame}")
        # fully out once the leading edge has travelled canvas + OBJECT_SIZE
        object.__setattr__(self, "leave_frame",
                           self.enter_frame - 1 + math.ceil((self.canvas + OBJECT_SIZE) / self.speed))

    @property
    def class_name(self) -> str:
        return CLASSES[self.label]

    def visible(self, t: int) -> bool:
        """Whether any pixel of the object is on the canvas at frame `t`."""
        return self.enter_frame <= t < self.leave_frame

    def position(self, t: int) -> tuple[int, int]:
        """Top-left corner (x, y) at frame `t`, in canvas pixels; off-canvas (negative or >= canvas)
        outside [enter_frame, leave_frame)."""
        x, y = _top_left(self.direction, self.speed, self.lane, self.enter_frame, self.canvas, t)
        return int(x), int(y)


@dataclass
class Stream:
    """A video of `num_frames` frames [canvas, canvas, 3] uint8 showing `tracks` (ordered by strictly
    increasing enter_frame, so "the one before" is always defined) over a background fixed by `seed`."""

    seed: int
    split: str
    num_frames: int
    tracks: list[Track]
    canvas: int = 112
    background: np.ndarray = field(init=False, repr=False, compare=False)  # uint8 [canvas, canvas, 3]
    _sprites: np.ndarray = field(init=False, repr=False, compare=False)  # uint8 [K, 28, 28, 3]
    _enter: np.ndarray = field(init=False, repr=False, compare=False)  # int64 [K]
    _leave: np.ndarray = field(init=False, repr=False, compare=False)  # int64 [K]

    def __post_init__(self):
        _check_stream_args(self.seed, self.num_frames, self.split, self.canvas)
        images, _ = _split_arrays(self.split)
        for i, track in enumerate(self.tracks):
            check(track.canvas == self.canvas, f"track {track.object_id} is for a {track.canvas} px canvas, "
                                               f"the stream's is {self.canvas} px")
            check(0 <= track.image_index < len(images), f"track {track.object_id}: image_index {track.image_index} "
                                                        f"is outside the {self.split} split (size {len(images)})")
            check(track.enter_frame < self.num_frames, f"track {track.object_id} enters at frame {track.enter_frame}, "
                                                       f"after the stream's last frame {self.num_frames - 1}")
            check(i == 0 or track.enter_frame > self.tracks[i - 1].enter_frame,
                  "tracks must be ordered by strictly increasing enter_frame (one object enters per frame at most)")
        rng = np.random.default_rng([self.seed, 1])
        # a dim per-stream colour plus fixed fine noise: textured, dark, and the same in every frame
        base = rng.integers(0, _BACKGROUND_MAX // 2, 3)
        noise = rng.integers(0, _BACKGROUND_MAX // 2, (self.canvas, self.canvas, 1))
        self.background = (base + noise).astype(np.uint8)
        tints = np.array([t.tint for t in self.tracks], np.float64).reshape(-1, 1, 1, 3)
        grey = images[[t.image_index for t in self.tracks]].reshape(-1, OBJECT_SIZE, OBJECT_SIZE, 1)
        self._sprites = np.rint(grey * tints).astype(np.uint8)
        self._enter = np.array([t.enter_frame for t in self.tracks], np.int64)
        self._leave = np.array([t.leave_frame for t in self.tracks], np.int64)

    def __len__(self) -> int:
        return self.num_frames

    def _check_frame(self, t: int) -> None:
        check(isinstance(t, (int, np.integer)) and 0 <= t < self.num_frames,
              f"frame index must be an int in [0, {self.num_frames}), got {t!r}")

    def frame(self, t: int) -> Tensor:
        """Frame `t` -> uint8 [canvas, canvas, 3] (RGB): the background with each visible object's sprite
        drawn by per-pixel maximum (a dark sprite pixel shows the background, as a lit object on a dark
        screen would)."""
        self._check_frame(t)
        out = self.background.copy()
        c, s = self.canvas, OBJECT_SIZE
        for k in np.flatnonzero((self._enter <= t) & (t < self._leave)):
            x, y = self.tracks[k].position(t)
            x0, y0, x1, y1 = max(x, 0), max(y, 0), min(x + s, c), min(y + s, c)
            region = out[y0:y1, x0:x1]
            np.maximum(region, self._sprites[k, y0 - y:y1 - y, x0 - x:x1 - x], out=region)
        return torch.from_numpy(out)

    def __iter__(self):
        """Frames 0 .. num_frames - 1, each rendered when it is reached."""
        return (self.frame(t) for t in range(self.num_frames))

    def on_screen(self, t: int) -> list[Track]:
        """Tracks with a pixel on the canvas at frame `t`, left to right by x, then top to bottom by y."""
        self._check_frame(t)
        visible = [self.tracks[k] for k in np.flatnonzero((self._enter <= t) & (t < self._leave))]
        return sorted(visible, key=lambda tr: (*tr.position(t), tr.object_id))


def _check_stream_args(seed: int, num_frames: int, split: str, canvas: int) -> None:
    check(isinstance(seed, (int, np.integer)) and seed >= 0, f"seed must be a non-negative int, got {seed!r}")
    check(isinstance(num_frames, (int, np.integer)) and num_frames >= 1,
          f"num_frames must be a positive int, got {num_frames!r}")
    check(split in SPLITS, f"split must be one of {SPLITS}, got {split!r}")
    check(isinstance(canvas, (int, np.integer)) and canvas >= OBJECT_SIZE,
          f"canvas must be an int of at least {OBJECT_SIZE} px (one Fashion-MNIST image), got {canvas!r}")


def _paths_meet(a: Track, b: Track) -> bool:
    """Whether the two objects' 28x28 boxes intersect at any frame both are visible."""
    t = np.arange(max(a.enter_frame, b.enter_frame), min(a.leave_frame, b.leave_frame))
    if t.size == 0:
        return False
    ax, ay = _top_left(a.direction, a.speed, a.lane, a.enter_frame, a.canvas, t)
    bx, by = _top_left(b.direction, b.speed, b.lane, b.enter_frame, b.canvas, t)
    return bool(np.any((np.abs(ax - bx) < OBJECT_SIZE) & (np.abs(ay - by) < OBJECT_SIZE)))


def make_stream(seed: int, num_frames: int, split: str = "train", *, canvas: int = 112, max_on_screen: int = 3,
                mean_gap: float = 40.0) -> Stream:
    """A stream of `num_frames` frames whose objects are random `split` images, determined by `seed`.

    Entries are `mean_gap` frames apart on average (geometric gaps, at least 1); an entry is delayed while
    `max_on_screen` objects are visible or while every motion tried for it would touch an object on screen.
    With the defaults about two objects are visible on average (a crossing takes 46-139 frames)."""
    _check_stream_args(seed, num_frames, split, canvas)
    check(isinstance(max_on_screen, int) and max_on_screen >= 1,
          f"max_on_screen must be a positive int, got {max_on_screen!r}")
    check(mean_gap >= 1, f"mean_gap must be at least 1 frame, got {mean_gap!r}")
    _, labels = _split_arrays(split)
    rng = np.random.default_rng([seed, 0])
    tracks: list[Track] = []
    live: list[Track] = []  # placed tracks still visible at or after the entry being placed
    enter = int(rng.integers(0, math.ceil(mean_gap)))
    while enter < num_frames:
        image_index = int(rng.integers(0, len(labels)))
        tint = rng.uniform(0.5, 1.0, 3)
        tint = tuple(float(v) for v in tint / tint.max())
        track = None
        while track is None and enter < num_frames:
            live = [tr for tr in live if tr.leave_frame > enter]
            if len(live) >= max_on_screen:
                # later entries only add objects, so the screen stays full until one of these leaves
                enter = min(tr.leave_frame for tr in live)
                continue
            for _ in range(_PLACEMENT_TRIES):
                candidate = Track(object_id=len(tracks), label=int(labels[image_index]), image_index=image_index,
                                  direction=DIRECTIONS[int(rng.integers(0, len(DIRECTIONS)))],
                                  speed=SPEEDS[int(rng.integers(0, len(SPEEDS)))],
                                  lane=int(rng.integers(0, canvas - OBJECT_SIZE + 1)), enter_frame=enter,
                                  tint=tint, canvas=canvas)
                if not any(_paths_meet(candidate, tr) for tr in live):
                    track = candidate
                    break
            else:
                enter += 1
        if track is None:
            break
        tracks.append(track)
        live.append(track)
        enter = track.enter_frame + int(rng.geometric(1.0 / mean_gap))
    return Stream(seed=int(seed), split=split, num_frames=int(num_frames), tracks=tracks, canvas=canvas)


@dataclass
class Question:
    """A question asked right after frame `frame` has been seen, and its exact-match `answer`.

    For kind "when" (a proactive request) `answer` is the class word to say at `trigger_frame`, the first
    frame at or after `frame` where an object of that class comes into view, or None if none does in the
    stream (the model should then stay silent)."""

    frame: int
    kind: str
    text: str
    answer: str
    trigger_frame: int | None = None


def ask(stream: Stream, frame: int, kind: str, subject: str | None = None) -> Question | None:
    """The question of `kind` at `frame` about class word `subject` (for "before", "direction", "when";
    None for "now", "count" and "describe"), or None when it is not well defined: the subject is not on screen exactly
    once ("before", "direction"), already on screen ("when": a request is about a new appearance), or more
    items have appeared than there are number words ("count")."""
    check(kind in KINDS, f"question kind must be one of {KINDS}, got {kind!r}")
    stream._check_frame(frame)
    needs_subject = kind in ("before", "direction", "when")
    check(needs_subject == (subject is not None),
          f"kind {kind!r} {'needs a class word subject' if needs_subject else 'takes no subject'}, got {subject!r}")
    check(subject is None or subject in CLASSES, f"subject must be one of {CLASSES}, got {subject!r}")
    visible = stream.on_screen(frame)
    trigger = None
    if kind == "now":
        answer = " and ".join(tr.class_name for tr in visible) or "nothing"
    elif kind == "describe":
        answer = " and ".join(f"{tr.class_name} {tr.direction}" for tr in visible) or "nothing"
    elif kind == "count":
        appeared = sum(tr.enter_frame <= frame for tr in stream.tracks)
        if appeared >= len(NUMBER_WORDS):
            return None
        answer = NUMBER_WORDS[appeared]
    elif kind == "when":
        if any(tr.class_name == subject for tr in visible):
            return None
        trigger = next((tr.enter_frame for tr in stream.tracks
                        if tr.class_name == subject and tr.enter_frame >= frame), None)
        answer = subject
    else:
        matches = [tr for tr in visible if tr.class_name == subject]
        if len(matches) != 1:
            return None
        if kind == "direction":
            answer = matches[0].direction
        else:  # before: tracks are ordered by entry, so the one before is the previous in the list
            i = stream.tracks.index(matches[0])
            answer = stream.tracks[i - 1].class_name if i > 0 else "nothing"
    return Question(frame=int(frame), kind=kind, text=TEMPLATES[kind].format(subject), answer=answer,
                    trigger_frame=trigger)


def questions(stream: Stream, rng_or_seed: np.random.Generator | int, num: int,
              kinds: tuple[str, ...] | list[str] = KINDS) -> list[Question]:
    """Up to `num` well-defined questions on `stream`, sorted by frame and spread over it: one per equal
    slice of the frames, at a random frame of the slice with a random kind of `kinds` (a few draws are
    tried; a slice where none is well defined, e.g. "count" late in a long stream, gives no question)."""
    check(isinstance(num, int) and num >= 0, f"num must be a non-negative int, got {num!r}")
    kinds = tuple(kinds)
    check(len(kinds) > 0, "kinds must name at least one question kind")
    for kind in kinds:
        check(kind in KINDS, f"question kind must be one of {KINDS}, got {kind!r}")
    if isinstance(rng_or_seed, np.random.Generator):
        rng = rng_or_seed
    else:
        check(isinstance(rng_or_seed, (int, np.integer)) and rng_or_seed >= 0,
              f"rng_or_seed must be a numpy Generator or a non-negative int, got {rng_or_seed!r}")
        rng = np.random.default_rng(rng_or_seed)
    edges = np.linspace(0, stream.num_frames, num + 1).astype(np.int64)
    out = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        hi = max(hi, lo + 1)
        for _ in range(_PLACEMENT_TRIES):
            frame = int(rng.integers(lo, min(hi, stream.num_frames)))
            kind = kinds[int(rng.integers(0, len(kinds)))]
            subjects = _subjects(stream, frame, kind)
            if not subjects:
                continue
            question = ask(stream, frame, kind, subjects[int(rng.integers(0, len(subjects)))])
            if question is not None:
                out.append(question)
                break
    return sorted(out, key=lambda q: q.frame)


def _subjects(stream: Stream, frame: int, kind: str) -> list[str | None]:
    """What a question of `kind` at `frame` can be about: [None] for kinds without a subject, the classes
    shown exactly once for "before"/"direction", the classes not in view for "when" (possibly none)."""
    if kind in ("now", "count", "describe"):
        return [None]
    shown = [tr.class_name for tr in stream.on_screen(frame)]
    if kind == "when":
        return [c for c in CLASSES if c not in shown]
    return [c for c in dict.fromkeys(shown) if shown.count(c) == 1]
