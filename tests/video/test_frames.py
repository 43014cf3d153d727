"""open_frames: files (exact ffv1 round trip, lossy mp4), arrays and iterables, fps subsampling,
the bounded decode queue, stopping the decoder thread, and the errors a user can cause."""

import itertools
import threading
import time

import av
import numpy as np
import pytest
import torch

from mmaccel.errors import InputError
from mmaccel.video.frames import Frame, open_frames


def moving_square(i: int, h: int = 64, w: int = 64) -> np.ndarray:
    """Frame i of a test clip: red ramps with i, a white 20x20 square moves right one pixel a frame."""
    a = np.zeros((h, w, 3), np.uint8)
    a[:, :, 0] = i * 4
    a[10:30, i % 40:i % 40 + 20] = 255
    return a


def write_video(path, n: int = 30, codec: str = "ffv1", pix_fmt: str = "bgr0", sizes=None) -> list[np.ndarray]:
    """Write n frames at 30 fps; ffv1 in bgr0 is lossless for RGB, so a read must give them back exactly."""
    frames = [moving_square(i) for i in range(n)]
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=30)
        stream.width, stream.height, stream.pix_fmt = 64, 64, pix_fmt
        for a in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(a, format="rgb24")))
        container.mux(stream.encode())
    return frames


def decoder_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("mmaccel-frames:")]


def wait_until(condition, timeout: float = 2.0) -> bool:
    end = time.monotonic() + timeout
    while not condition() and time.monotonic() < end:
        time.sleep(0.01)
    return condition()


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    path = tmp_path_factory.mktemp("video") / "clip.mkv"
    return path, write_video(path, n=60)


# --- files -------------------------------------------------------------------------------------

def test_file_round_trip_is_exact(clip):
    path, written = clip
    with open_frames(path) as stream:
        assert stream.size is None
        frames = list(stream)
        assert stream.size == (64, 64)
    assert len(frames) == 60 and all(isinstance(f, Frame) for f in frames)
    assert [f.index for f in frames] == list(range(60))
    assert [f.time for f in frames] == pytest.approx([i / 30 for i in range(60)], abs=1e-3)   # mkv keeps ms
    for f, a in zip(frames, written):
        assert f.pixels.dtype == torch.uint8 and f.pixels.shape == (64, 64, 3) and f.pixels.is_contiguous()
        assert torch.equal(f.pixels, torch.from_numpy(a))


def test_lossy_mp4_keeps_count_times_and_content(tmp_path):
    path = tmp_path / "clip.mp4"
    write_video(path, n=30, codec="libx264", pix_fmt="yuv420p")
    frames = list(open_frames(str(path)))
    assert len(frames) == 30
    assert [f.time for f in frames] == pytest.approx([i / 30 for i in range(30)], abs=1e-6)
    square = frames[5].pixels[12:28, 7:23].float().mean()       # inside the square at frame 5
    background = frames[5].pixels[40:60, :, 1].float().mean()    # green is 0 below the square
    assert square > 200 and background < 30


def test_fps_subsamples_a_file_by_time(clip):
    frames = list(open_frames(clip[0], fps=5))
    assert len(frames) == 10                                     # 60 frames at 30 fps -> every 6th
    assert [f.index for f in frames] == list(range(10))
    assert [f.time for f in frames] == pytest.approx([0.2 * k for k in range(10)], abs=1e-3)
    assert torch.equal(frames[3].pixels, torch.from_numpy(clip[1][18]))


def test_decoder_stays_at_most_queue_size_ahead(clip):
    with open_frames(clip[0], queue_size=2) as stream:
        assert wait_until(lambda: stream.decoded >= 3)
        time.sleep(0.2)                           # the consumer reads nothing: the decoder must wait
        assert stream.decoded == 3                # queue_size frames queued, one waiting to be put
        next(stream)
        assert wait_until(lambda: stream.decoded >= 4)
        time.sleep(0.1)
        assert stream.decoded == 4


def test_close_stops_the_decoder_thread(clip):
    stream = open_frames(clip[0], queue_size=1)
    next(stream)
    assert decoder_threads()
    stream.close()
    stream.close()                                # idempotent
    assert wait_until(lambda: not decoder_threads())
    assert list(stream) == []


def test_breaking_out_and_dropping_the_stream_stops_the_thread(clip):
    for _frame in open_frames(clip[0], queue_size=1):
        break
    assert wait_until(lambda: not decoder_threads())


# --- arrays and iterables ----------------------------------------------------------------------

def test_uint8_array_and_tensor():
    frames = np.stack([moving_square(i) for i in range(5)])
    for source in (frames, torch.from_numpy(frames)):
        out = list(open_frames(source))
        assert [f.time for f in out] == [0.0, 1.0, 2.0, 3.0, 4.0]
        assert all(torch.equal(f.pixels, torch.from_numpy(a)) for f, a in zip(out, frames))
    out[0].pixels.fill_(7)
    assert frames[0, 0, 0, 0] == 0                # a frame never aliases the caller's array


def test_grayscale_and_float_arrays_become_rgb_uint8():
    gray = np.arange(2 * 4 * 6, dtype=np.uint8).reshape(2, 4, 6)
    out = list(open_frames(gray))
    assert out[1].pixels.shape == (4, 6, 3) and torch.equal(out[1].pixels[..., 2], torch.from_numpy(gray[1]))
    floats = torch.tensor([0.0, 0.5, 1.0, 0.2]).reshape(1, 1, 4, 1).expand(1, 1, 4, 3)
    (frame,) = open_frames(floats)
    assert frame.pixels[0, :, 0].tolist() == [0, 128, 255, 51]
    assert frame.pixels.is_contiguous()


def test_source_fps_gives_times_and_subsampling():
    frames = np.zeros((60, 8, 8, 3), np.uint8)
    out = list(open_frames(frames, source_fps=30, fps=2))
    assert len(out) == 4 and [f.time for f in out] == pytest.approx([0.0, 0.5, 1.0, 1.5])
    assert [f.time for f in open_frames(frames[:3], source_fps=10)] == pytest.approx([0.0, 0.1, 0.2])


def test_endless_generator_is_read_only_as_far_as_consumed():
    pulled, released = [], []

    def camera():
        try:
            for i in itertools.count():
                pulled.append(i)
                yield torch.full((4, 4, 3), i % 256, dtype=torch.uint8)
        finally:
            released.append(True)                 # a webcam would be released here

    with open_frames(camera(), source_fps=30, fps=5) as stream:
        first = [f for _, f in zip(range(3), stream)]
    assert [f.pixels[0, 0, 0].item() for f in first] == [0, 6, 12]
    assert [f.time for f in first] == pytest.approx([0.0, 0.2, 0.4])
    assert len(pulled) == 13 and stream.decoded == 13
    assert released == [True]


def test_iterable_of_mixed_frame_kinds():
    from PIL import Image

    red = np.zeros((4, 4, 3), np.uint8)
    red[..., 0] = 255
    items = [red, torch.from_numpy(red), Image.fromarray(red), np.full((4, 4), 255, np.uint8)]
    out = list(open_frames(iter(items)))
    assert [f.pixels[0, 0].tolist() for f in out] == [[255, 0, 0]] * 3 + [[255, 255, 255]]


# --- errors a user can cause -------------------------------------------------------------------

def test_missing_path_directory_and_text_files(tmp_path):
    with pytest.raises(InputError, match="not found"):
        open_frames(tmp_path / "missing.mp4")
    with pytest.raises(InputError, match="directory"):
        open_frames(tmp_path)
    for name in ("notes.mp4", "notes.txt"):      # ffmpeg would open a .txt as ANSI-art video
        (tmp_path / name).write_text("hello, this is text\n" * 50)
        with pytest.raises(InputError, match=name):
            open_frames(tmp_path / name)
    assert not [t for t in decoder_threads() if "notes" in t.name or "missing" in t.name]


def test_file_without_a_video_stream(tmp_path):
    path = tmp_path / "tone.wav"
    with av.open(str(path), "w") as container:
        stream = container.add_stream("pcm_s16le", rate=8000, layout="mono")
        samples = av.AudioFrame.from_ndarray(np.zeros((1, 800), np.int16), format="s16", layout="mono")
        samples.sample_rate = 8000
        container.mux(stream.encode(samples))
        container.mux(stream.encode())
    with pytest.raises(InputError, match="no video stream.*audio"):
        open_frames(path)


def read_all(path):
    with open_frames(path) as stream:
        return list(stream)


def test_corrupt_files_raise_input_error_naming_the_file(tmp_path):
    truncated = tmp_path / "truncated.mp4"      # an mp4's index (moov) is at the end: cut off, it cannot open
    write_video(truncated, codec="libx264", pix_fmt="yuv420p")
    truncated.write_bytes(truncated.read_bytes()[: truncated.stat().st_size // 2])
    with pytest.raises(InputError, match="truncated.mp4"):
        read_all(truncated)
    damaged = tmp_path / "damaged.mkv"          # opens fine; the decoder fails on the damaged frame
    write_video(damaged)
    data = bytearray(damaged.read_bytes())
    data[len(data) // 3: len(data) // 3 + 200] = b"\xff" * 200
    damaged.write_bytes(bytes(data))
    with pytest.raises(InputError, match="cannot decode .*damaged.mkv"):
        read_all(damaged)
    assert wait_until(lambda: not decoder_threads())


def test_zero_frames():
    with pytest.raises(InputError, match="no frames in the frame array"):
        list(open_frames(np.zeros((0, 8, 8, 3), np.uint8)))
    with pytest.raises(InputError, match="no frames in the iterable"):
        list(open_frames(iter([])))


def test_frame_changing_size_mid_stream():
    items = [np.zeros((64, 64, 3), np.uint8)] * 17 + [np.zeros((48, 64, 3), np.uint8)]
    stream = open_frames(items)
    assert len([f for _, f in zip(range(17), stream)]) == 17
    with pytest.raises(InputError, match="frame 17 is 48x64, the stream's frames are 64x64"):
        next(stream)
    assert list(stream) == []


@pytest.mark.parametrize("kwargs, message", [
    (dict(fps=0), "fps must be a positive"),
    (dict(fps=-2.0), "fps must be a positive"),
    (dict(source_fps=float("nan")), "source_fps must be a positive"),
    (dict(fps="5"), "fps must be a positive"),
    (dict(queue_size=0), "queue_size must be an integer >= 1"),
    (dict(queue_size=2.5), "queue_size must be an integer >= 1"),
    (dict(fps=2), r"source_fps=30, fps=2"),
])
def test_bad_rates_and_queue_size(kwargs, message):
    with pytest.raises(InputError, match=message):
        open_frames(np.zeros((2, 8, 8, 3), np.uint8), **kwargs)


def test_source_fps_on_a_file_is_refused(clip):
    with pytest.raises(InputError, match="read from the file"):
        open_frames(clip[0], source_fps=30)


@pytest.mark.parametrize("source, message", [
    (np.zeros((2, 8, 8, 4), np.uint8), r"shape \(2, 8, 8, 4\)"),
    (np.zeros((8, 8), np.uint8), r"shape \(8, 8\)"),
    (np.zeros((2, 8, 8, 3), np.int64), "dtype int64"),
    (torch.zeros(2, 3, 8, 8), r"shape \(2, 3, 8, 8\)"),
    (42, "got int"),
])
def test_wrong_array_shape_dtype_or_type(source, message):
    with pytest.raises(InputError, match=message):
        open_frames(source)


@pytest.mark.parametrize("frame, message", [
    (np.zeros((8, 8, 3), np.int32), "frame 0 of the iterable must be .*dtype int32"),
    (np.full((8, 8), 2.0, np.float32), r"frame 0 of the iterable: float pixels must be in \[0, 1\]"),
    (np.zeros((8, 8, 2), np.uint8), r"shape \(8, 8, 2\)"),
    ("frame.png", "got str"),
])
def test_wrong_frame_in_an_iterable(frame, message):
    with pytest.raises(InputError, match=message):
        list(open_frames([frame]))
