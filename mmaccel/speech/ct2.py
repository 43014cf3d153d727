"""Reader for CTranslate2 `model.bin` files (binary format version 6), in plain numpy.

CTranslate2 has no API that returns its weights, but the file is a flat list of named arrays
(all integers little-endian):

    u32 binary_version (6) | str spec_name ("WhisperSpec") | u32 spec_revision | u32 n_variables
    n_variables x { str name | u8 rank | rank x u32 dim | u8 dtype | u32 n_bytes | n_bytes raw }
    u32 n_aliases | n_aliases x { str alias | str target }

    str   = u16 byte length including a trailing NUL, then the utf-8 bytes and the NUL
    dtype = 0 float32, 1 int8, 2 int16, 3 int32, 4 float16, 5 bfloat16

A model too big for one upload may be split into byte-range parts (`model.bin.part1`, `.part2`,
...); `read_model_bin` takes the list of parts and never writes the joined file to disk.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mmaccel.errors import InputError, ModelNotFoundError, check

BINARY_VERSION = 6
DTYPES: dict[int, np.dtype] = {
    0: np.dtype("<f4"),
    1: np.dtype("i1"),
    2: np.dtype("<i2"),
    3: np.dtype("<i4"),
    4: np.dtype("<f2"),
    5: np.dtype("<u2"),  # bfloat16 bit patterns; widened to float32 on read (numpy has no bf16)
}
BFLOAT16 = 5

PathLike = str | os.PathLike


@dataclass
class CT2Model:
    """The contents of one `model.bin`.

    `variables` maps each name to its array as stored (float16 stays float16; bfloat16 becomes
    float32, exactly). Aliases are resolved: an alias name maps to the *same* array object as its
    target (e.g. Whisper's `decoder/projection/weight` -> `decoder/embeddings/weight`). The arrays
    are views into the buffer the file was read into; copy one before changing it in place.
    """

    spec_name: str
    spec_revision: int
    variables: dict[str, np.ndarray]
    aliases: dict[str, str]


# ----------------------------------------------------------------------------------------------
# Bytes and checksums


def _as_paths(paths: PathLike | Sequence[PathLike]) -> list[Path]:
    if isinstance(paths, (str, os.PathLike)):
        return [Path(paths)]
    check(len(paths) > 0, "no model.bin file given: pass a path or a non-empty list of part files")
    return [Path(p) for p in paths]


def describe(paths: PathLike | Sequence[PathLike]) -> str:
    """How error messages name a file or a split file: `a/model.bin` or `a/x.part1 + b/x.part2`."""
    return " + ".join(str(p) for p in _as_paths(paths))


def read_parts(paths: PathLike | Sequence[PathLike]) -> bytearray:
    """The bytes of `paths` joined in order, read into one preallocated buffer (no copy on disk)."""
    paths = _as_paths(paths)
    for path in paths:
        if not path.is_file():
            raise ModelNotFoundError(f"CTranslate2 model file not found: {path}")
    sizes = [path.stat().st_size for path in paths]
    buffer = bytearray(sum(sizes))
    view = memoryview(buffer)
    start = 0
    for path, size in zip(paths, sizes):
        with open(path, "rb") as f:
            got = f.readinto(view[start : start + size])
        if got != size:  # the file shrank between stat() and read()
            raise InputError(f"{path} changed while being read: expected {size} bytes, read {got}")
        start += size
    return buffer


def sha256_hex(data: bytes | bytearray | memoryview) -> str:
    """Hex sha256 of bytes already in memory."""
    return hashlib.sha256(data).hexdigest()


def verify_sha256(data: bytes | bytearray | memoryview, expected: str, name: str, remedy: str = "") -> None:
    """Raise `InputError` naming `name` unless sha256(`data`) equals `expected` (hex).

    Third-party weight uploads are checked before any byte of them is parsed or used.
    """
    got = sha256_hex(data)
    if got != expected.lower():
        hint = f"; {remedy}" if remedy else ""
        raise InputError(
            f"{name} is tampered or corrupt: sha256 {got} does not match the expected {expected}{hint}"
        )


# ----------------------------------------------------------------------------------------------
# Parsing


class _Cursor:
    """Sequential little-endian reads from a buffer; running past the end names the shortfall."""

    def __init__(self, buffer: bytes | bytearray | memoryview, what: str):
        self.view = memoryview(buffer)
        self.pos = 0
        self.what = what

    def take(self, n: int, item: str) -> memoryview:
        end = self.pos + n
        if end > len(self.view):
            raise InputError(
                f"{self.what} is truncated: {item} needs bytes {self.pos}..{end}, so the file must be at least "
                f"{end} bytes, but it has {len(self.view)}; reinstall it, or pass all of its parts in order"
            )
        chunk = self.view[self.pos : end]
        self.pos = end
        return chunk

    def uint(self, fmt: str, item: str) -> int:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), item))[0]

    def string(self, item: str) -> str:
        n = self.uint("<H", f"the length of {item}")
        raw = bytes(self.take(n, item))
        check(n > 0 and raw[-1] == 0, f"{self.what} is corrupt at byte {self.pos - n}: {item} is not NUL-terminated")
        return raw[:-1].decode("utf-8")


def _read_variable(cur: _Cursor) -> tuple[str, np.ndarray]:
    name = cur.string(f"variable name at byte {cur.pos}")
    rank = cur.uint("<B", f"the rank of '{name}'")
    shape = tuple(cur.uint("<I", f"dimension {i} of '{name}'") for i in range(rank))
    code = cur.uint("<B", f"the dtype of '{name}'")
    if code not in DTYPES:
        raise InputError(
            f"{cur.what}: variable '{name}' has unknown dtype code {code} "
            f"(known: {', '.join(f'{c}={d.name}' for c, d in DTYPES.items())}); "
            "the file is corrupt or from a newer CTranslate2"
        )
    dtype = DTYPES[code]
    n_bytes = cur.uint("<I", f"the byte count of '{name}'")
    want = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    check(n_bytes == want, f"{cur.what}: variable '{name}' {shape} {dtype.name} should hold {want} bytes, header says {n_bytes}")
    array = np.frombuffer(cur.take(n_bytes, f"the data of '{name}'"), dtype=dtype).reshape(shape)
    if code == BFLOAT16:  # bf16 is the top half of a float32
        array = (array.astype(np.uint32) << 16).view(np.float32)
    return name, array


def _resolve_aliases(variables: dict[str, np.ndarray], aliases: dict[str, str], what: str) -> None:
    for alias in aliases:
        target, seen = aliases[alias], {alias}
        while target in aliases and target not in variables:  # alias of an alias
            check(target not in seen, f"{what}: alias cycle through '{target}'")
            seen.add(target)
            target = aliases[target]
        check(target in variables, f"{what}: alias '{alias}' points to missing variable '{aliases[alias]}'")
        variables[alias] = variables[target]


def parse_model_bin(buffer: bytes | bytearray | memoryview, what: str = "model.bin") -> CT2Model:
    """Parse a whole `model.bin` held in memory. `what` names the file(s) in error messages."""
    cur = _Cursor(buffer, what)
    version = cur.uint("<I", "the binary version")
    if version != BINARY_VERSION:
        raise InputError(
            f"{what} is not a CTranslate2 model.bin of binary version {BINARY_VERSION} "
            f"(its first 4 bytes read as version {version}); pass a model.bin written by CTranslate2 >= 3, "
            "or all of its parts in order"
        )
    spec_name = cur.string("the spec name")
    spec_revision = cur.uint("<I", "the spec revision")
    n_variables = cur.uint("<I", "the variable count")
    variables = dict(_read_variable(cur) for _ in range(n_variables))
    n_aliases = cur.uint("<I", "the alias count")
    aliases = {}
    for _ in range(n_aliases):
        alias = cur.string("an alias name")
        aliases[alias] = cur.string(f"the target of alias '{alias}'")
    trailing = len(cur.view) - cur.pos
    check(trailing == 0,
          f"{what} has {trailing} unexpected bytes after its last alias; a part is repeated or the file is corrupt")
    _resolve_aliases(variables, aliases, what)
    return CT2Model(spec_name, spec_revision, variables, aliases)


def read_model_bin(paths: PathLike | Sequence[PathLike], sha256: str | None = None, remedy: str = "") -> CT2Model:
    """Read a `model.bin`, or its parts in order, optionally verifying the joined bytes first.

    Args:
        paths: one file, or the part files whose concatenation is the model.bin.
        sha256: expected hex digest of the (joined) file; checked before parsing.
        remedy: what to tell the user when the checksum fails (e.g. the pip command to reinstall).
    """
    what = describe(paths)
    buffer = read_parts(paths)
    if sha256 is not None:
        verify_sha256(buffer, sha256, what, remedy)
    return parse_model_bin(buffer, what)
