"""Precisions: what "auto" picks per CPU and why, bf16 refused where it is emulated, converted copies close to the
model and leaving it alone."""

import pytest
import torch
from torch import nn

from mmaccel.engine import machine, precision
from mmaccel.engine.int8 import Int8Linear
from mmaccel.engine.precision import convert, resolve_precision
from mmaccel.errors import InputError
from tests.speech.conftest import features, tiny_whisper


@pytest.fixture
def cpu_units(monkeypatch):
    def set_units(units: list[str]):
        monkeypatch.setattr(precision, "cpu_bf16_units", lambda: units)
        monkeypatch.setattr(precision, "fast_bf16_matmul", lambda device: device.type == "cuda" or bool(units))
    return set_units


def test_auto_picks_native_bf16_and_says_why(cpu_units):
    cpu_units(["avx512_bf16"])
    got = resolve_precision("auto")
    assert (got.name, got.requested) == ("bf16", "auto") and "avx512_bf16" in got.reason
    cpu_units([])
    got = resolve_precision("auto")
    assert got.name == "fp32" and "no native bf16" in got.reason
    assert resolve_precision("int8").name == "int8" and resolve_precision("fp32").reason == "fp32 (asked for)"


def test_auto_runs_a_compiled_part_in_int8_where_the_cpu_has_int8_units(cpu_units, monkeypatch):
    cpu_units(["avx512_bf16"])
    monkeypatch.setattr(precision, "cpu_int8_units", lambda: ["avx512_vnni"])
    got = resolve_precision("auto", compiled=True)
    assert got.name == "int8" and "compiled" in got.reason and "avx512_vnni" in got.reason
    assert resolve_precision("auto").name == "bf16"                          # eager: bf16 where native
    assert resolve_precision("auto", "cuda", compiled=True).name == "bf16"   # compiled steps are the CPU's
    monkeypatch.setattr(precision, "cpu_int8_units", lambda: [])
    assert resolve_precision("auto", compiled=True).name == "bf16"          # no int8 dot products: as before


def test_bf16_asked_for_without_native_units_is_one_clear_error(cpu_units):
    cpu_units([])
    with pytest.raises(InputError, match="needs native bf16 units") as err:
        resolve_precision("bf16")
    assert "\n" not in str(err.value)
    cpu_units(["amx_bf16"])
    assert resolve_precision("bf16").name == "bf16"


def test_unknown_precisions_are_refused():
    with pytest.raises(InputError, match="unknown precision 'fp8'; choose from auto, fp32, bf16, int8"):
        resolve_precision("fp8")
    with pytest.raises(InputError, match="unknown precision 'auto'"):
        convert(nn.Linear(2, 2), "auto")                 # convert takes a resolved precision
    with pytest.raises(InputError, match="no linear layers"):
        convert(nn.Conv1d(2, 2, 1), "int8")


def _relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("name, bound", [("bf16", 0.03), ("int8", 0.05)])
def test_converted_encoders_are_close_copies_and_the_model_is_untouched(name, bound):
    encoder = tiny_whisper().model.encoder
    before = {k: v.clone() for k, v in encoder.state_dict().items()}
    x = features(2)
    with torch.no_grad():
        want = encoder(x).last_hidden_state
        variant = convert(encoder, name)
        got = variant(x.to(variant.conv1.weight.dtype)).last_hidden_state
    assert variant is not encoder and 0 < _relative_error(got, want) < bound
    assert all(torch.equal(v, encoder.state_dict()[k]) for k, v in before.items())
    assert convert(encoder, "fp32") is encoder
    if name == "int8":          # every linear layer, and nothing else, runs in int8
        assert all(not isinstance(m, nn.Linear) for m in variant.modules())
        assert sum(isinstance(m, Int8Linear) for m in variant.modules()) == 6 * len(encoder.layers)
        assert variant.conv1.weight.dtype == torch.float32


def test_machine_flags_come_from_cpuinfo(monkeypatch, tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("model name\t: Some CPU\nflags\t\t: fpu avx2 fma avx512f avx512_vnni\n")
    real_open = open
    monkeypatch.setattr("builtins.open", lambda path, *a, **k: real_open(info if path == "/proc/cpuinfo" else path, *a, **k))
    machine.cpu_flags.cache_clear()
    try:
        assert machine.cpu_bf16_units() == [] and machine.cpu_int8_units() == ["avx512_vnni"]
        assert machine.cpu_model() == "Some CPU"
    finally:
        machine.cpu_flags.cache_clear()
