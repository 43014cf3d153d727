"""Shared checkpoint reading: containers, prefixes, derived entries, layout errors."""

import pytest
import torch

from mmaccel.checkpoints import check_layout, read_checkpoint, unwrap_state_dict
from mmaccel.errors import InputError, ModelNotFoundError


@pytest.mark.parametrize("wrap", [lambda s: s, lambda s: {"model": s}, lambda s: {"module": s}, lambda s: {"state_dict": s}])
def test_containers_and_prefixes(wrap):
    state = {"_orig_mod.a.weight": torch.ones(2), "_orig_mod.freqs_cis": torch.ones(3), "_orig_mod.b.kv_cache.k": torch.ones(1)}
    out = unwrap_state_dict(wrap(state), "ckpt", drop=("freqs_cis", ".kv_cache.k"))
    assert list(out) == ["a.weight"]


def test_read_errors(tmp_path):
    with pytest.raises(ModelNotFoundError, match="nope.pt"):
        read_checkpoint(tmp_path / "nope.pt", "test checkpoint")
    (tmp_path / "bad.pt").write_bytes(b"not a pickle")
    with pytest.raises(InputError, match="cannot read"):
        read_checkpoint(tmp_path / "bad.pt", "test checkpoint")
    torch.save([1, 2], tmp_path / "list.pt")
    with pytest.raises(InputError, match="holds a list"):
        read_checkpoint(tmp_path / "list.pt", "test checkpoint")


def test_layout_errors_name_the_keys():
    expected = {"a": torch.zeros(2), "b": torch.zeros(3)}
    with pytest.raises(InputError, match=r"missing key\(s\), first: b; 1 unexpected key\(s\), first: c"):
        check_layout(expected, {"a": torch.zeros(2), "c": torch.zeros(1)}, "ckpt", "toy")
    with pytest.raises(InputError, match=r"wrong shape .* first: a \(5,\) != \(2,\)"):
        check_layout(expected, {"a": torch.zeros(5), "b": torch.zeros(3)}, "ckpt", "toy")
