"""The streaming-video task: streams are seeded, lazily rendered, use only their split's images, and every
question's answer agrees with a truth computed here from the tracks' geometry (not with the module's helpers)."""

import time

import numpy as np
import pytest
import torch

from mmaccel.errors import InputError
from mmaccel.image.data import FASHION_MNIST_ROOT, load_fashion_mnist
from mmaccel.video.data import CLASSES, DIRECTIONS, KINDS, VOCAB, Question, Stream, Track, ask, make_stream, questions

pytestmark = pytest.mark.skipif(not FASHION_MNIST_ROOT.is_dir(), reason="Debian dataset-fashion-mnist not installed")

S = 28  # Fashion-MNIST image side
NUMBERS = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen " \
          "sixteen seventeen eighteen nineteen twenty".split()


def box(track: Track, t: int) -> tuple[int, int]:
    """Top-left corner written from the start position: at enter_frame exactly `speed` px are on screen."""
    c, v, d = track.canvas, track.speed, t - track.enter_frame
    start = {"right": (v - S, track.lane), "left": (c - v, track.lane),
             "down": (track.lane, v - S), "up": (track.lane, c - v)}[track.direction]
    step = {"right": (v, 0), "left": (-v, 0), "down": (0, v), "up": (0, -v)}[track.direction]
    return start[0] + step[0] * d, start[1] + step[1] * d


def shown(track: Track, t: int) -> bool:
    """Some pixel of the 28x28 box lies on the canvas (and the object has entered)."""
    x, y = box(track, t)
    c = track.canvas
    return t >= track.enter_frame and -S < x < c and -S < y < c


def truth_on_screen(stream: Stream, t: int) -> list[Track]:
    return sorted((tr for tr in stream.tracks if shown(tr, t)), key=lambda tr: box(tr, t))


@pytest.fixture(scope="module")
def stream():
    return make_stream(7, 3000)


@pytest.fixture(scope="module")
def test_stream():
    return make_stream(11, 3000, "test")


@pytest.fixture(scope="module")
def splits():
    return {split: tuple(x.numpy() for x in load_fashion_mnist(split)) for split in ("train", "test")}


def test_same_seed_same_stream():
    a, b, other = make_stream(3, 800), make_stream(3, 800), make_stream(4, 800)
    assert a == b and len(a.tracks) > 5
    assert a.tracks != other.tracks
    for t in (0, 123, 799):
        assert torch.equal(a.frame(t), b.frame(t))


def test_frames_are_lazy_and_iterable():
    s = make_stream(5, 60)
    frames = list(s)
    assert len(frames) == len(s) == 60
    assert all(f.shape == (112, 112, 3) and f.dtype == torch.uint8 for f in frames)
    assert all(torch.equal(f, s.frame(t)) for t, f in enumerate(frames))


@pytest.mark.parametrize("fixture", ["stream", "test_stream"])
def test_objects_are_their_split_images(request, splits, fixture):
    s = request.getfixturevalue(fixture)
    images, labels = splits[s.split]
    assert all(0 <= tr.image_index < len(images) and labels[tr.image_index] == tr.label for tr in s.tracks)
    checked = 0
    for tr in s.tracks:
        inside = [t for t in range(tr.enter_frame, min(tr.leave_frame, s.num_frames))
                  if 0 <= box(tr, t)[0] <= 112 - S and 0 <= box(tr, t)[1] <= 112 - S]
        if not inside:
            continue
        t = inside[len(inside) // 2]
        x, y = box(tr, t)
        region = s.frame(t).numpy()[y:y + S, x:x + S]
        bg = s.background[y:y + S, x:x + S]
        full = int(np.argmax(tr.tint))
        assert tr.tint[full] == 1.0
        # the untinted channel is the split's image itself, drawn over the background by maximum
        assert np.array_equal(region[..., full], np.maximum(bg[..., full], images[tr.image_index]))
        tinted = np.rint(images[tr.image_index][..., None] * np.array(tr.tint)).astype(np.uint8)
        assert np.array_equal(region, np.maximum(bg, tinted))
        checked += 1
    assert checked >= 10


def test_splits_draw_from_different_image_sets(stream, test_stream):
    assert max(tr.image_index for tr in stream.tracks) >= 10_000  # beyond the test split: train images
    assert max(tr.image_index for tr in test_stream.tracks) < 10_000


def test_background_is_static_and_dark(stream):
    bg = stream.background
    assert bg.shape == (112, 112, 3) and bg.dtype == np.uint8 and bg.max() < 32 and bg.std() > 1
    empty = [t for t in range(stream.num_frames) if not truth_on_screen(stream, t)]
    assert len(empty) >= 2
    for t in empty[:: max(1, len(empty) // 10)]:
        assert np.array_equal(stream.frame(t).numpy(), bg)
    for t in range(0, 600):  # every pixel no object covers is the background, frame after frame
        mask = np.zeros((112, 112), bool)
        for tr in truth_on_screen(stream, t):
            x, y = box(tr, t)
            mask[max(y, 0):max(y + S, 0), max(x, 0):max(x + S, 0)] = True
        assert np.array_equal(stream.frame(t).numpy()[~mask], bg[~mask])


def test_tracks_cross_from_edge_to_edge(stream):
    unit = {"right": (1, 0), "left": (-1, 0), "down": (0, 1), "up": (0, -1)}
    for tr in stream.tracks:
        assert tr.direction in DIRECTIONS and tr.speed in (1, 2, 3) and 0 <= tr.lane <= 112 - S
        e, leave = tr.enter_frame, tr.leave_frame
        assert not shown(tr, e - 1) and shown(tr, e) and shown(tr, leave - 1) and not shown(tr, leave)
        assert all(tr.visible(t) == shown(tr, t) for t in (e - 1, e, leave - 1, leave))
        x, y = box(tr, e)
        far = {"right": x < 0, "left": x + S > 112, "down": y < 0, "up": y + S > 112}
        assert far[tr.direction], "enters at the edge it moves away from"
        x, y = box(tr, leave - 1)
        near = {"right": x + S > 112, "left": x < 0, "down": y + S > 112, "up": y < 0}
        assert near[tr.direction], "leaves at the opposite edge"
        for t in (e, (e + leave) // 2):
            (x0, y0), (x1, y1) = tr.position(t), tr.position(t + 1)
            assert (x0, y0) == box(tr, t)
            assert (x1 - x0, y1 - y0) == (tr.speed * unit[tr.direction][0], tr.speed * unit[tr.direction][1])
    assert {tr.direction for tr in stream.tracks} == set(DIRECTIONS)


@pytest.mark.parametrize("max_on_screen", [1, 3])
def test_screen_limit_and_no_overlap(max_on_screen):
    s = make_stream(2, 2000, max_on_screen=max_on_screen, mean_gap=20)
    peak = 0
    for t in range(s.num_frames):
        visible = truth_on_screen(s, t)
        peak = max(peak, len(visible))
        assert [tr.object_id for tr in s.on_screen(t)] == [tr.object_id for tr in visible]
        corners = [box(tr, t) for tr in visible]
        for i in range(len(corners)):
            for j in range(i + 1, len(corners)):
                (ax, ay), (bx, by) = corners[i], corners[j]
                assert abs(ax - bx) >= S or abs(ay - by) >= S, f"objects overlap at frame {t}"
    assert peak == max_on_screen  # dense gaps fill the screen


@pytest.fixture(scope="module")
def hand_stream(splits):
    # A: bag   right speed 2 lane 10, frames 0..68   (x = -28 + 2 (t + 1))
    # B: sneaker down speed 1 lane 70, frames 5..143 (y = -28 + (t - 4))
    # C: bag   left  speed 3 lane 80, frames 20..65  (x = 112 - 3 (t - 19))
    # D: coat  up    speed 1 lane 0,  frames 150..288 (y = 112 - (t - 149))
    bag, sneaker, coat = (int(np.flatnonzero(splits["train"][1] == label)[0]) for label in (8, 7, 4))
    tracks = [Track(0, 8, bag, "right", 2, 10, 0), Track(1, 7, sneaker, "down", 1, 70, 5),
              Track(2, 8, bag, "left", 3, 80, 20), Track(3, 4, coat, "up", 1, 0, 150)]
    return Stream(seed=0, split="train", num_frames=300, tracks=tracks)


def test_hand_stream_geometry(hand_stream, splits):
    a, b, c, d = hand_stream.tracks
    assert (a.leave_frame, b.leave_frame, c.leave_frame, d.leave_frame) == (69, 144, 66, 289)
    assert a.position(10) == (-6, 10) and b.position(10) == (70, -22)
    assert c.position(30) == (79, 80) and d.position(150) == (0, 111)
    frame = hand_stream.frame(68).numpy()  # A shows its two leftmost columns at the right edge
    image = splits["train"][0][a.image_index]
    assert a.tint == (1.0, 1.0, 1.0)  # the default: the grey image in every channel
    assert np.array_equal(frame[10:38, 110:112], np.maximum(hand_stream.background[10:38, 110:112], image[:, :2, None]))
    assert np.array_equal(hand_stream.frame(69).numpy()[10:38], hand_stream.background[10:38])  # A has left


@pytest.mark.parametrize("frame,kind,subject,answer", [
    (3, "now", None, "bag"), (3, "count", None, "one"), (3, "direction", "bag", "right"),
    (3, "before", "bag", "nothing"),
    (10, "now", None, "bag and sneaker"), (10, "count", None, "two"), (10, "before", "sneaker", "bag"),
    (10, "direction", "sneaker", "down"),
    (30, "now", None, "bag and sneaker and bag"), (30, "count", None, "three"), (30, "before", "sneaker", "bag"),
    (30, "before", "bag", None), (30, "direction", "bag", None), (30, "direction", "coat", None),
    (70, "now", None, "sneaker"), (70, "before", "sneaker", "bag"),
    (149, "now", None, "nothing"), (149, "count", None, "three"),
    (150, "now", None, "coat"), (150, "before", "coat", "bag"), (150, "direction", "coat", "up"),
    (150, "count", None, "four"), (0, "count", None, "one"),
])
def test_hand_checked_answers(hand_stream, frame, kind, subject, answer):
    q = ask(hand_stream, frame, kind, subject)
    if answer is None:
        assert q is None, "ambiguous or absent subject: no question"
    else:
        assert q.answer == answer and q.kind == kind and q.frame == frame and q.trigger_frame is None


@pytest.mark.parametrize("frame,subject,trigger", [(30, "coat", 150), (149, "coat", 150), (70, "bag", None),
                                                   (0, "sneaker", 5), (4, "sneaker", 5), (100, "t-shirt", None)])
def test_hand_checked_when(hand_stream, frame, subject, trigger):
    q = ask(hand_stream, frame, "when", subject)
    assert q.answer == subject and q.trigger_frame == trigger and q.text == f"tell me when a {subject} appears ?"


@pytest.mark.parametrize("frame,subject", [(30, "bag"), (150, "coat"), (5, "sneaker")])
def test_when_is_not_asked_while_in_view(hand_stream, frame, subject):
    assert ask(hand_stream, frame, "when", subject) is None


def test_ties_in_x_are_ordered_top_to_bottom():
    s = Stream(seed=1, split="test", num_frames=10,
               tracks=[Track(0, 1, 2, "up", 1, 40, 0), Track(1, 5, 0, "down", 1, 40, 1)])
    assert [tr.object_id for tr in s.on_screen(5)] == [1, 0]
    assert ask(s, 5, "now").answer == "sandal and trouser"
    assert ask(s, 5, "describe").answer == "sandal down and trouser up"


def truth_answer(s: Stream, q: Question):
    """The answer recomputed from geometry; None where the question should not have been asked."""
    visible = truth_on_screen(s, q.frame)
    words = q.text.split()
    subject = next((w for w in words if w in CLASSES), None)
    entered = sorted((tr for tr in s.tracks if tr.enter_frame <= q.frame), key=lambda tr: tr.enter_frame)
    if q.kind == "now":
        return " and ".join(CLASSES[tr.label] for tr in visible) or "nothing", None
    if q.kind == "describe":
        return " and ".join(f"{CLASSES[tr.label]} {tr.direction}" for tr in visible) or "nothing", None
    if q.kind == "count":
        return (NUMBERS[len(entered)] if len(entered) <= 20 else None), None
    if q.kind == "when":
        if any(CLASSES[tr.label] == subject for tr in visible):
            return None, None
        later = [tr.enter_frame for tr in s.tracks if CLASSES[tr.label] == subject and tr.enter_frame >= q.frame]
        return subject, min(later, default=None)
    match = [tr for tr in visible if CLASSES[tr.label] == subject]
    if len(match) != 1:
        return None, None
    if q.kind == "direction":
        return match[0].direction, None
    earlier = [tr for tr in entered if tr.enter_frame < match[0].enter_frame]
    return (CLASSES[earlier[-1].label] if earlier else "nothing"), None


@pytest.mark.parametrize("seed,split", [(0, "train"), (1, "test")])
def test_generated_questions_are_right(seed, split):
    s = make_stream(seed, 1500, split)
    qs = questions(s, seed, 80) + questions(s, np.random.default_rng(seed), 40, kinds=("count",))
    assert {q.kind for q in qs} == set(KINDS)
    for q in qs:
        assert (q.answer, q.trigger_frame) == truth_answer(s, q), q
    triggered = [q for q in qs if q.kind == "when" and q.trigger_frame is not None]
    assert triggered and all(q.trigger_frame > q.frame for q in triggered)


def test_questions_sorted_spread_and_seeded(stream):
    qs = questions(stream, 3, 50)
    frames = [q.frame for q in qs]
    assert frames == sorted(frames) and len(qs) >= 45 and len(set(frames)) == len(frames)
    assert frames[0] < 3000 / 10 and frames[-1] > 3000 * 9 / 10
    assert qs == questions(stream, 3, 50)
    assert all(q.kind == "direction" for q in questions(stream, 4, 20, kinds=["direction"]))
    # past twenty items "count" has no number word: the question is skipped, not capped
    assert ask(stream, 2999, "count") is None
    assert all(q.frame < 1200 for q in questions(stream, 5, 30, kinds=("count",)))


def test_vocab_covers_every_text(stream, test_stream):
    assert len(set(VOCAB)) == len(VOCAB) and "?" in VOCAB
    for s in (stream, test_stream):
        for q in questions(s, 0, 200):
            assert q.text == q.text.lower() and q.text.endswith(" ?") and "  " not in q.text
            assert q.answer == q.answer.lower() and "  " not in q.answer
            assert all(w in VOCAB for w in q.text.split() + q.answer.split()), q


def test_bad_input_raises():
    s = make_stream(0, 20)
    bad = [lambda: make_stream(0, 0), lambda: make_stream(0, 10, "val"), lambda: make_stream(0, 10, canvas=20),
           lambda: make_stream(-1, 10), lambda: make_stream(0, 10, max_on_screen=0),
           lambda: make_stream(0, 10, mean_gap=0.5), lambda: questions(s, 0, 5, kinds=("why",)),
           lambda: questions(s, 0, 5, kinds=()), lambda: ask(s, 0, "why"), lambda: ask(s, 0, "before"),
           lambda: ask(s, 0, "when", "hat"), lambda: ask(s, 0, "now", "bag"), lambda: s.frame(-1),
           lambda: s.frame(20), lambda: s.on_screen(20),
           lambda: Track(0, 1, 0, "diagonal", 1, 0, 0), lambda: Track(0, 1, 0, "up", 0, 0, 0),
           lambda: Track(0, 1, 0, "up", 1, 90, 0),
           lambda: Stream(0, "test", 10, [Track(0, 1, 10_000, "up", 1, 0, 0)]),
           lambda: Stream(0, "test", 10, [Track(0, 1, 0, "up", 1, 0, 3), Track(1, 1, 0, "up", 1, 0, 3)])]
    for make in bad:
        with pytest.raises(InputError):
            make()


def test_render_time(stream):
    stream.frame(0)
    start = time.perf_counter()
    for t in range(1000):
        stream.frame(t)
    elapsed = time.perf_counter() - start
    print(f"\nrendered 1000 frames in {elapsed * 1e3:.1f} ms ({elapsed:.3f} ms per frame)")
