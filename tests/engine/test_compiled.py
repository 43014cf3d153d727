"""Compiled steps (OpenVINO): close to eager, any batch, cached on disk and read back by the next call, a corrupt
cache rebuilt, a failed export or a refused check falling back to eager with one warning line, the module
untouched."""

import shutil
import warnings

import pytest
import torch
from torch import nn

from mmaccel.engine import compiled as compiled_mod
from mmaccel.engine.compiled import compile_module, graph_key
from mmaccel.errors import InputError
from mmaccel.paths import CACHE_MARKER
from tests.conftest import NATIVE_CHEAP
from tests.speech.conftest import features, tiny_whisper


class Block(nn.Module):
    """A small attention block: what an encoder layer does."""

    def __init__(self, d: int = 32):
        super().__init__()
        torch.manual_seed(0)
        self.norm = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)

    def forward(self, x):
        q, k, v = self.qkv(self.norm(x)).chunk(3, -1)
        return x + self.out(nn.functional.scaled_dot_product_attention(q, k, v))


def _only_dir(root):
    return [p for p in root.iterdir() if p.is_dir() and p.name != "blob" and not p.name.startswith(".")]


def test_a_compiled_module_matches_eager_at_any_batch_and_is_read_back_from_the_cache(tmp_path):
    block = Block().eval()
    before = {k: v.clone() for k, v in block.state_dict().items()}
    x = torch.randn(1, 16, 32)
    first = compile_module(block, (x,), "fp32", cache_dir=tmp_path)
    assert first is not None and first.source == "export" and first.error < 1e-5 and first.first_call_s > 0
    for batch in (1, 3):
        xs = torch.randn(batch, 16, 32)
        with torch.no_grad():
            torch.testing.assert_close(first(xs), block(xs), rtol=1e-4, atol=1e-5)
    (cached,) = _only_dir(tmp_path)
    assert (cached / CACHE_MARKER).is_file() and (cached / "model.xml").is_file()
    again = compile_module(block, (x,), "fp32", cache_dir=tmp_path)
    assert again.source == "cache" and again.error is None
    torch.testing.assert_close(again(x), first(x))
    assert all(torch.equal(v, before[k]) for k, v in block.state_dict().items())     # the module is untouched


def test_the_cache_key_follows_the_weights_and_the_shapes():
    block = Block()
    key = graph_key(block, (torch.zeros(1, 16, 32),), "v")
    assert graph_key(block, (torch.zeros(4, 16, 32),), "v") == key            # the batch is free
    assert graph_key(block, (torch.zeros(1, 8, 32),), "v") != key
    assert graph_key(block, (torch.zeros(1, 16, 32),), "w") != key
    with torch.no_grad():
        block.out.bias += 1e-3
    assert graph_key(block, (torch.zeros(1, 16, 32),), "v") != key


def test_a_corrupt_cache_is_rebuilt_with_one_warning(tmp_path):
    block, x = Block().eval(), torch.randn(2, 16, 32)
    compile_module(block, (x,), "fp32", cache_dir=tmp_path)
    (cached,) = _only_dir(tmp_path)
    (cached / "model.xml").write_text("<net>not a graph")
    shutil.rmtree(tmp_path / "blob", ignore_errors=True)
    with pytest.warns(UserWarning, match="could not be read .*rebuilding it") as caught:
        rebuilt = compile_module(block, (x,), "fp32", cache_dir=tmp_path)
    assert rebuilt is not None and rebuilt.source == "export" and len(caught) == 1
    assert "\n" not in str(caught[0].message)
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(x), block(x), rtol=1e-4, atol=1e-5)
    assert compile_module(block, (x,), "fp32", cache_dir=tmp_path).source == "cache"


def test_a_cache_that_cannot_be_written_still_compiles_with_one_warning(tmp_path):
    root = tmp_path / "ro"
    root.write_text("a file where the cache folder would be")          # nothing can be made under it
    block, x = Block().eval(), torch.randn(1, 16, 32)
    with pytest.warns(UserWarning, match="could not be cached") as caught:
        got = compile_module(block, (x,), "fp32", cache_dir=root)
    assert got is not None and got.source == "export" and len(caught) == 1
    with torch.no_grad():
        torch.testing.assert_close(got(x), block(x), rtol=1e-4, atol=1e-5)


class Untraceable(nn.Module):
    def forward(self, x):
        return torch.from_numpy(x.numpy() * 2)          # leaves the graph: a tracer bakes the example in


class Textual(nn.Module):
    def forward(self, x):
        return f"{x.sum()}"                               # not a tensor: nothing to export


def test_an_export_failure_or_a_refused_check_falls_back_to_eager_with_one_line(tmp_path, monkeypatch):
    for module, why in ((Untraceable(), "runs eagerly: "), (Textual(), "runs eagerly: export failed")):
        with pytest.warns(UserWarning, match=f"{type(module).__name__} {why}") as caught:
            assert compile_module(module, (torch.ones(1, 4),), "fp32", cache_dir=tmp_path) is None
        assert len(caught) == 1 and "\n" not in str(caught[0].message)
    monkeypatch.setitem(compiled_mod.TOLERANCE, "fp32", -1.0)        # every graph differs by more than that
    with pytest.warns(UserWarning, match="differs from eager"):
        assert compile_module(Block().eval(), (torch.randn(1, 16, 32),), "fp32", cache_dir=tmp_path) is None
    assert not _only_dir(tmp_path)                                     # a refused graph is never cached


def test_bad_arguments_are_one_line_errors():
    with pytest.raises(InputError, match="unknown precision 'half'; choose from fp32, bf16, int8"):
        compile_module(Block(), (torch.zeros(1, 16, 32),), "half")
    with pytest.raises(InputError, match="needs example input tensors"):
        compile_module(Block(), (), "fp32")
    with pytest.raises(InputError, match="takes an nn.Module"):
        compile_module(lambda x: x, (torch.zeros(1),), "fp32")


@pytest.mark.skipif(NATIVE_CHEAP != "bf16", reason="bf16 compiles natively only with AVX512-BF16 / AMX")
def test_a_whisper_encoder_compiled_in_bf16_stays_close_to_fp32(tmp_path):
    from mmaccel.speech.decoder import EncoderStates

    states = EncoderStates(tiny_whisper().model.encoder).eval()
    x = features(2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # the tracer's notes on Hugging Face's shape checks
        got = compile_module(states, (x,), "bf16", cache_dir=tmp_path)
    assert got is not None and got.precision == "bf16" and got.error < 0.05
    with torch.no_grad():
        want = states(x)
    assert float((got(x) - want).norm() / want.norm()) < 0.05


def test_an_int8_graph_holds_int8_weights_and_stays_close_to_eager(tmp_path):
    """At int8 the graph keeps each linear weight as int8 with a scale per row (the cache's weights file is about
    a quarter of fp32's) and its output stays near the fp32 module's; the module passed in is untouched."""
    block = Block(d=64).eval()
    before = {k: v.clone() for k, v in block.state_dict().items()}
    x = torch.randn(2, 16, 64)
    fp32 = compile_module(block, (x,), "fp32", cache_dir=tmp_path / "fp32")
    int8 = compile_module(block, (x,), "int8", cache_dir=tmp_path / "int8")
    assert int8 is not None and int8.precision == "int8" and 0 < int8.error < 0.05
    with torch.no_grad():
        want = block(x)
    assert float((int8(x) - want).norm() / want.norm()) < 0.05
    assert not torch.equal(int8(x), fp32(x))
    sizes = {name: (_only_dir(tmp_path / name)[0] / "model.bin").stat().st_size for name in ("fp32", "int8")}
    assert sizes["int8"] < 0.45 * sizes["fp32"], sizes
    assert all(torch.equal(v, before[k]) for k, v in block.state_dict().items())
    assert isinstance(block.qkv, nn.Linear)
