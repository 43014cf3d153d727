"""The CTranslate2 model.bin reader: round trip through a tiny writer, split files, and the errors."""

import struct

import numpy as np
import pytest

from mmaccel.errors import InputError, ModelNotFoundError
from mmaccel.speech.ct2 import describe, parse_model_bin, read_model_bin, sha256_hex, verify_sha256

DTYPE_CODES = {np.dtype("float32"): 0, np.dtype("int8"): 1, np.dtype("int16"): 2, np.dtype("int32"): 3,
               np.dtype("float16"): 4}
BF16 = "bf16"  # marker for a uint16 array that should be written with CTranslate2's bfloat16 code (5)


def _string(text: str) -> bytes:
    raw = text.encode() + b"\0"
    return struct.pack("<H", len(raw)) + raw


def model_bin_bytes(variables: dict, aliases: dict | None = None, spec: str = "WhisperSpec", revision: int = 3,
                    version: int = 6) -> bytes:
    """A CTranslate2 model.bin. `variables` values are arrays, or (BF16, uint16 array) for bfloat16."""
    out = [struct.pack("<I", version), _string(spec), struct.pack("<I", revision), struct.pack("<I", len(variables))]
    for name, array in variables.items():
        code = 5 if isinstance(array, tuple) else DTYPE_CODES[array.dtype]
        array = np.array(array[1] if isinstance(array, tuple) else array, order="C")  # keeps 0-d arrays 0-d
        out += [_string(name), struct.pack("<B", array.ndim), struct.pack(f"<{array.ndim}I", *array.shape),
                struct.pack("<B", code), struct.pack("<I", array.nbytes), array.astype(array.dtype.newbyteorder("<")).tobytes()]
    aliases = aliases or {}
    out.append(struct.pack("<I", len(aliases)))
    for alias, target in aliases.items():
        out += [_string(alias), _string(target)]
    return b"".join(out)


def write_model_bin(path, variables: dict, aliases: dict | None = None, **header) -> bytes:
    data = model_bin_bytes(variables, aliases, **header)
    path.write_bytes(data)
    return data


def sample_variables() -> dict:
    rng = np.random.default_rng(0)
    return {
        "encoder/conv1/weight": rng.standard_normal((4, 3, 3)).astype(np.float16),
        "encoder/layer_norm/gamma": rng.standard_normal(5).astype(np.float32),
        "decoder/embeddings/weight": rng.standard_normal((7, 4)).astype(np.float16),
        "decoder/num_heads": np.array(2, dtype=np.int16),
        "decoder/pre_norm": np.array(1, dtype=np.int8),
        "ids": np.arange(6, dtype=np.int32).reshape(2, 3),
        "bf": (BF16, np.array([0x3F80, 0xC000], dtype=np.uint16)),  # 1.0, -2.0
    }


def test_round_trip(tmp_path):
    variables = sample_variables()
    path = tmp_path / "model.bin"
    write_model_bin(path, variables, {"decoder/projection/weight": "decoder/embeddings/weight"})
    model = read_model_bin(path)
    assert (model.spec_name, model.spec_revision) == ("WhisperSpec", 3)
    assert model.aliases == {"decoder/projection/weight": "decoder/embeddings/weight"}
    for name, want in variables.items():
        got = model.variables[name]
        if isinstance(want, tuple):  # bfloat16 comes back as float32, exactly
            assert got.dtype == np.float32 and got.tolist() == [1.0, -2.0]
            continue
        assert got.dtype == want.dtype and got.shape == want.shape  # fp16 stays fp16, scalars stay 0-d
        np.testing.assert_array_equal(got, want)
    assert model.variables["decoder/projection/weight"] is model.variables["decoder/embeddings/weight"]


def test_parts_are_read_as_one_file(tmp_path):
    data = write_model_bin(tmp_path / "whole.bin", sample_variables())
    cuts = [0, 37, 101, len(data)]  # cut inside names and inside tensor data
    parts = []
    for i, (a, b) in enumerate(zip(cuts, cuts[1:])):
        parts.append(tmp_path / f"model.bin.part{i + 1}")
        parts[-1].write_bytes(data[a:b])
    whole, split = read_model_bin(tmp_path / "whole.bin"), read_model_bin(parts, sha256=sha256_hex(data))
    assert whole.variables.keys() == split.variables.keys()
    for name in whole.variables:
        np.testing.assert_array_equal(whole.variables[name], split.variables[name])
    assert describe(parts) == " + ".join(map(str, parts))


def test_truncated_file_names_the_sizes(tmp_path):
    data = model_bin_bytes(sample_variables())
    path = tmp_path / "model.bin"
    path.write_bytes(data[:-5])  # the last 4-byte alias count and one byte of the last tensor are gone
    with pytest.raises(InputError, match="truncated") as info:
        read_model_bin(path)
    message = str(info.value)
    assert str(path) in message and f"has {len(data) - 5}" in message
    assert f"at least {len(data) - 4}" in message  # the end of the last tensor's data


def test_missing_part_is_truncation(tmp_path):
    data = model_bin_bytes(sample_variables())
    (tmp_path / "model.bin.part1").write_bytes(data[:60])
    with pytest.raises(InputError, match="truncated"):
        read_model_bin([tmp_path / "model.bin.part1"])


def test_bad_version_and_wrong_magic(tmp_path):
    path = tmp_path / "model.bin"
    path.write_bytes(model_bin_bytes(sample_variables(), version=5))
    with pytest.raises(InputError, match="binary version 6.*version 5"):
        read_model_bin(path)
    path.write_bytes(b'{"not": "a model"}')
    with pytest.raises(InputError, match="not a CTranslate2 model.bin"):
        read_model_bin(path)


def test_unknown_dtype_names_the_variable(tmp_path):
    data = bytearray(model_bin_bytes({"w": np.zeros(3, np.float32)}))
    # header: u32 version, str spec, u32 revision, u32 count, str "w", u8 rank, u32 dim, then the dtype byte
    at = 4 + len(_string("WhisperSpec")) + 4 + 4 + len(_string("w")) + 1 + 4
    assert data[at] == 0
    data[at] = 9
    with pytest.raises(InputError, match="'w' has unknown dtype code 9"):
        parse_model_bin(data)


def test_trailing_bytes_and_bad_alias(tmp_path):
    data = model_bin_bytes(sample_variables())
    with pytest.raises(InputError, match="3 unexpected bytes"):
        parse_model_bin(data + b"abc")
    with pytest.raises(InputError, match="points to missing variable 'nope'"):
        parse_model_bin(model_bin_bytes(sample_variables(), {"x": "nope"}))


def test_missing_file(tmp_path):
    with pytest.raises(ModelNotFoundError, match="not found: .*nothing.bin"):
        read_model_bin(tmp_path / "nothing.bin")
    with pytest.raises(InputError, match="non-empty list"):
        read_model_bin([])


def test_checksum_mismatch_names_the_file(tmp_path):
    path = tmp_path / "model.bin"
    data = write_model_bin(path, sample_variables())
    verify_sha256(data, sha256_hex(data), "model.bin")  # passes
    with pytest.raises(InputError, match=r"model.bin is tampered or corrupt.*reinstall it"):
        read_model_bin(path, sha256="0" * 64, remedy="reinstall it")
