"""Frames in, one at a time: from a video file, a frame array, or any iterable of frames (a live
source such as a webcam), optionally subsampled to at most `fps` frames a second.

Files are decoded with PyAV in a daemon thread that feeds a bounded queue, so decoding overlaps the
consumer's compute and only `queue_size` decoded frames (plus one being handed over) are held. Frames that
subsampling drops are never converted to RGB. Every delivered frame is a fresh uint8 [H, W, 3]
tensor: nothing here aliases or modifies an array a caller passed in.
"""

from __future__ import annotations

import math
import os
import queue
import sys
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from mmaccel.errors import InputError, MMAccelError, check

_END = object()                 # the decoder thread's "file finished" marker
_POLL_S = 0.05                  # how often a blocked decoder thread looks at its stop flag


@dataclass(frozen=True)
class Frame:
    """One delivered frame. `index` counts delivered frames from 0; `time` is seconds from the
    stream start (a file's presentation time; for arrays and iterables the source frame's position
    / source_fps, or the position itself); `pixels` is uint8 [H, W, 3] RGB, contiguous."""

    index: int
    time: float
    pixels: Tensor


def open_frames(source: Any, *, fps: float | None = None, source_fps: float | None = None,
                queue_size: int = 8) -> FrameStream:
    """Open a video file path, a frame array/tensor [N, H, W, 3] or [N, H, W] (uint8, or float in
    [0, 1]), or an iterable of frames ([H, W, 3] / [H, W] arrays or tensors, or PIL images).

    `fps` keeps at most that many frames a second, by frame time. A file's times are read from it;
    an array or iterable has none, so subsampling one needs its rate:
    `open_frames(frames, source_fps=30, fps=2)` keeps every 15th frame. `queue_size` bounds how
    many decoded frames a file reader holds ahead of the consumer.
    """
    for name, rate in (("fps", fps), ("source_fps", source_fps)):
        check(rate is None or (isinstance(rate, (int, float)) and not isinstance(rate, bool)
                               and math.isfinite(rate) and rate > 0),
              f"{name} must be a positive number of frames per second, got {rate!r}")
    check(isinstance(queue_size, int) and not isinstance(queue_size, bool) and queue_size >= 1,
          f"queue_size must be an integer >= 1, got {queue_size!r}")
    if isinstance(source, (str, os.PathLike)):
        check(source_fps is None, "source_fps is for arrays and iterables; a video file's frame times are "
              "read from the file (pass only fps= to subsample it)")
        reader = _FileReader(Path(source).expanduser(), fps, queue_size)
        return FrameStream(reader, str(reader.path))
    check(fps is None or source_fps is not None,
          f"fps={fps} subsamples by frame time, but an array or iterable has no frame times; give its rate too, "
          f"e.g. open_frames(frames, source_fps=30, fps={fps})")
    if isinstance(source, (np.ndarray, Tensor)):
        _check_layout(source, "a frame array", batch=True)
        name = f"the frame array of shape {tuple(source.shape)}"
        return FrameStream(_IterableReader(source, source_fps, fps, name), name)
    check(isinstance(source, Iterable),
          f"source must be a video file path, a frame array [N, H, W, 3] or an iterable of frames; "
          f"got {type(source).__name__}")
    return FrameStream(_IterableReader(source, source_fps, fps, "the iterable"), "the iterable")


class FrameStream:
    """An iterator of `Frame` and a context manager. `close()` (idempotent; also on `with` exit,
    on an error, at the end and when the stream is garbage-collected) stops a file's decoder thread
    and closes the source. `size` is (H, W) once the first frame is delivered, else None;
    `decoded` counts frames taken from the source so far, delivered or dropped by subsampling."""

    def __init__(self, reader: _FileReader | _IterableReader, name: str):
        self._reader, self._name = reader, name
        self._count, self._size, self._closed = 0, None, False

    @property
    def size(self) -> tuple[int, int] | None:
        return self._size

    @property
    def decoded(self) -> int:
        return self._reader.decoded

    def __iter__(self) -> FrameStream:
        return self

    def __next__(self) -> Frame:
        if self._closed:
            raise StopIteration
        try:
            item = self._reader.read()
        except BaseException:
            self.close()
            raise
        if item is None:
            self.close()
            check(self._count > 0, f"no frames in {self._name}")
            raise StopIteration
        time, pixels = item
        size = (pixels.shape[0], pixels.shape[1])
        if self._size is not None and size != self._size:
            self.close()
            raise InputError(f"frame {self._count} is {size[0]}x{size[1]}, the stream's frames are "
                             f"{self._size[0]}x{self._size[1]} (H x W); all frames of one stream must have one size")
        self._size = size
        self._count += 1
        return Frame(self._count - 1, time, pixels)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._reader.close()

    def __enter__(self) -> FrameStream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            self._reader.stop()       # no join here: a finaliser must not block


def _subsample(timed: Iterable[tuple[float, Any]], fps: float | None) -> Iterator[tuple[float, Any]]:
    """Keep an item when its time reaches the next 1/fps slot. Slots are counted from time 0, not
    from the last kept frame, so jittery live timestamps do not drift the kept rate; the tolerance
    absorbs timestamps rounded by the container (e.g. 0.2 s stored as 199.99 ms)."""
    if fps is None:
        yield from timed
        return
    next_slot = -math.inf
    for time, item in timed:
        slot = time * fps
        if slot >= next_slot - 1e-6:
            next_slot = math.floor(slot + 1e-6) + 1
            yield time, item


class _FileReader:
    """Decodes a file's first video stream in a daemon thread into a queue of (time, pixels)."""

    def __init__(self, path: Path, fps: float | None, queue_size: int):
        try:
            import av
        except ModuleNotFoundError:
            raise MMAccelError("reading video files needs PyAV; install it with `pip install av`") from None
        self.path, self.decoded = path, 0
        check(path.exists(), f"video file not found: {path}")
        check(not path.is_dir(), f"{path} is a directory, not a video file")
        try:
            container = av.open(str(path), metadata_errors="ignore")
        except (av.FFmpegError, OSError) as err:
            raise InputError(f"cannot open {path} as a video ({err}); expected a video file such as mp4, "
                             "mkv, webm, avi or mov") from None
        # ffmpeg's "tty" demuxer opens any .txt as an ANSI-art video; a text file is never meant as one
        text, kinds = container.format.name == "tty", ", ".join(s.type for s in container.streams) or "none"
        if text or not container.streams.video:
            container.close()
            raise InputError(f"{path} is a text file, not a video" if text else
                             f"{path} has no video stream (its streams: {kinds})")
        self._container, self._fps = container, fps
        self._queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._decode, name=f"mmaccel-frames:{path.name}", daemon=True)
        self._thread.start()

    def _timed(self) -> Iterator[tuple[float, Any]]:
        stream = self._container.streams.video[0]
        start = float(stream.start_time * stream.time_base) if stream.start_time is not None else 0.0
        rate = float(stream.average_rate or 1)
        for frame in self._container.decode(video=0):
            # a frame without a presentation time (raw elementary streams) is placed by its count
            time = frame.time - start if frame.time is not None else self.decoded / rate
            self.decoded += 1
            yield time, frame
            if self._stop.is_set():
                return

    def _decode(self) -> None:
        try:
            for time, frame in _subsample(self._timed(), self._fps):
                if not self._put((time, torch.from_numpy(frame.to_ndarray(format="rgb24")))):
                    return
            self._put(_END)
        except Exception as err:     # corrupt data, unsupported codec: re-raised in the consumer
            self._put(err)
        finally:
            self._container.close()

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                pass
        return False

    def read(self) -> tuple[float, Tensor] | None:
        while True:
            try:
                item = self._queue.get(timeout=_POLL_S)
                break
            except queue.Empty:   # the thread always leaves _END or an error; this guards against it dying mute
                check(self._thread.is_alive() or not self._queue.empty(), f"the decoder of {self.path} stopped")
        if item is _END:
            return None
        if isinstance(item, Exception):
            raise InputError(f"cannot decode {self.path}: {item}") from None
        return item

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        self.stop()
        self._thread.join(timeout=5.0)


class _IterableReader:
    """Pulls frames from an array or an iterable on the consumer's thread, only as they are asked for."""

    def __init__(self, source: Any, source_fps: float | None, fps: float | None, name: str):
        self._items, self._name, self.decoded = iter(source), name, 0
        self._kept = _subsample(self._timed(source_fps), fps)

    def _timed(self, source_fps: float | None) -> Iterator[tuple[float, Any]]:
        for frame in self._items:
            index, self.decoded = self.decoded, self.decoded + 1
            yield (index / source_fps if source_fps else float(index)), (index, frame)

    def read(self) -> tuple[float, Tensor] | None:
        time, (index, frame) = next(self._kept, (None, (None, None)))
        return None if time is None else (time, _to_pixels(frame, f"frame {index} of {self._name}"))

    def close(self) -> None:
        """Close a generator source too, so its `finally:` runs (e.g. to release a camera)."""
        if hasattr(self._items, "close"):
            self._items.close()

    stop = close


def _check_layout(x: np.ndarray | Tensor, name: str, batch: bool = False) -> None:
    """Frames are [H, W, 3] RGB or [H, W] grayscale, uint8 or float; an array of them has N in front."""
    dims, dtype = tuple(x.shape[1:] if batch else x.shape), str(x.dtype).removeprefix("torch.")
    check(len(dims) in (2, 3) and dims[2:] in ((), (3,)) and min(dims[:2]) > 0
          and (dtype == "uint8" or dtype.startswith(("float", "bfloat"))),
          f"{name} must be {'[N, H, W, 3] RGB or [N, H, W]' if batch else '[H, W, 3] RGB or [H, W]'} grayscale, "
          f"uint8 or float in [0, 1]; got shape {tuple(x.shape)}, dtype {dtype}")


def _to_pixels(frame: Any, name: str) -> Tensor:
    """A new uint8 [H, W, 3] RGB tensor from one frame (array, tensor or PIL image)."""
    pil = sys.modules.get("PIL.Image")      # only a caller who imported PIL can pass a PIL image
    if pil is not None and isinstance(frame, pil.Image):
        frame = np.asarray(frame.convert("RGB"))
    check(isinstance(frame, (np.ndarray, Tensor)),
          f"{name} must be an array, a tensor or a PIL image, got {type(frame).__name__}")
    _check_layout(frame, name)
    is_uint8 = frame.dtype in (np.uint8, torch.uint8)
    if isinstance(frame, np.ndarray):   # always a copy: a frame never aliases the caller's buffer
        pixels = torch.from_numpy(np.array(frame, dtype=np.uint8 if is_uint8 else np.float32))
    else:
        pixels = frame.detach().to("cpu", torch.uint8 if is_uint8 else torch.float32, copy=True)
    if not is_uint8:
        low, high = pixels.min().item(), pixels.max().item()
        check(0.0 <= low and high <= 1.0, f"{name}: float pixels must be in [0, 1], found values in [{low}, {high}]")
        pixels = (pixels * 255).round().to(torch.uint8)
    if pixels.ndim == 2:
        pixels = pixels.unsqueeze(-1).expand(-1, -1, 3)
    return pixels.contiguous()
