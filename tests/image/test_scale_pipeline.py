"""ScalePipeline: loading (directory, official file + tokenizer, built-in), the three methods, stats
and clear errors."""

import pytest
import torch

from mmaccel.errors import InputError, ModelNotFoundError
from mmaccel.image.models.var import save_var
from mmaccel.image.pipeline import ImageOutput
from mmaccel.image.scale_methods import build_scale_method
from mmaccel.image.scale_pipeline import BUILTIN_SCALE, BUILTIN_SCALE_FILES, ScalePipeline
from mmaccel.image.tokenizers.msvq import save_msvq
from mmaccel.registries import method_registry
from tests.image.test_msvq import tiny_model
from tests.image.test_var import tiny_var


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("var")
    save_msvq(tiny_model(), path / "vq.safetensors")
    save_var(tiny_var(0), path / "var.safetensors")
    save_var(tiny_var(1, depth=1, embed_dim=16, num_heads=2), path / "refiner.safetensors")
    return path


@pytest.fixture(scope="module")
def pipe(folder):
    return ScalePipeline.from_pretrained(folder)


def test_methods_and_their_stats(pipe):
    ar = pipe.generate([0, 1, 4], "ar", seed=0, cfg_scale=2.0)
    assert len(ar.images) == 3 and ar.images[0].size == (16, 16)
    assert ar.tokens.shape == (3, 30) and (ar.stats.nfe, ar.stats.draft_passes) == (4, 0)
    assert ar.stats.cache_mb > 0 and ar.stats.new_tokens == 90 and ar.stats.wall_s > 0
    code = pipe.generate([0, 1, 4], "code", draft_steps=2, seed=0, cfg_scale=2.0)
    assert (code.stats.nfe, code.stats.draft_passes) == (2, 2)
    assert torch.equal(code.tokens[:, :5], ar.tokens[:, :5])      # the large model's scales, same seed
    assert code.stats.cache_mb < ar.stats.cache_mb
    pushed = pipe.generate([0, 1, 4], "code", draft_steps=2, seed=0, cfg_scale=2.0, refiner_cfg=50.0)
    assert torch.equal(pushed.tokens[:, :5], ar.tokens[:, :5]) and not torch.equal(pushed.tokens, code.tokens)
    cold = pipe.generate([0, 1, 4], "code", draft_steps=2, seed=0, cfg_scale=2.0, refiner_temperature=0.05)
    assert torch.equal(cold.tokens[:, :5], ar.tokens[:, :5]) and not torch.equal(cold.tokens, code.tokens)
    # the refiner's temperature is its scales' only: as a per-scale list it is the same draw
    listed = pipe.generate([0, 1, 4], "code", draft_steps=2, seed=0, cfg_scale=2.0, temperature=[1.0, 1.0, 0.05, 0.05])
    assert torch.equal(cold.tokens, listed.tokens)
    small = pipe.generate([0, 1, 4], "ar-small", seed=0, cfg_scale=2.0)
    assert small.stats.nfe == 4 and small.stats.cache_mb < ar.stats.cache_mb
    assert torch.equal(pipe.decode_pixels(ar.tokens), pipe.vq.decode(ar.indices))


def test_method_parameters_go_through_the_registry(pipe):
    """Parameters left as None or at -1 take the large VAR's values: the same tokens as not giving them."""
    code = pipe.generate([0, 1], "code", draft_steps=2, seed=0, cfg_scale=2.0)
    for kw in ({"refiner_cfg": None, "training_free": None}, {"refiner_cfg": -1.0, "refiner_temperature": -1.0},
               {"refiner_cfg": 2.0, "refiner_temperature": 1.0}):
        assert torch.equal(pipe.generate([0, 1], "code", draft_steps=2, seed=0, cfg_scale=2.0, **kw).tokens, code.tokens)
    assert pipe.methods() is method_registry("image-scale") and list(pipe.methods()) == ["ar", "ar-small", "code"]
    assert isinstance(code, ImageOutput) and torch.equal(code.tokens, torch.cat(code.indices, 1))
    assert not build_scale_method("code").lossless and build_scale_method("ar").lossless


def test_official_file_needs_its_tokenizer(folder, tmp_path):
    path = tmp_path / "var_d2.pth"
    torch.save(tiny_var(0).state_dict(), path)
    with pytest.raises(InputError, match="vq=PATH"):
        ScalePipeline.from_pretrained(path)
    pipe = ScalePipeline.from_pretrained(path, vq=folder / "vq.safetensors", refiner=None)
    assert pipe.refiner is None
    with pytest.raises(InputError, match="needs a refiner"):
        pipe.generate([0], "code")


@pytest.mark.parametrize("kwargs, match", [
    ({"method": "speculative"}, "unknown next-scale method"),
    ({"method": "ar", "draft_steps": 3}, "draft_steps"),
    ({"method": "ar", "refiner_cfg": 1.0}, "refiner_cfg"),
    ({"method": "code", "refiner_cfg": -0.5}, r"refiner_cfg must be >= 0 \(or -1: cfg_scale\)"),
    ({"method": "code", "refiner_cfg": -2.0}, r"refiner_cfg must be in \[-1.0, 1000.0\]"),
    ({"method": "ar", "refiner_temperature": 0.5}, "refiner_temperature"),
    ({"method": "code", "refiner_temperature": 0.0}, r"refiner_temperature must be > 0 \(or -1: temperature\)"),
    ({"method": "code", "refiner_temperature": "hot"}, "refiner_temperature must be in .*, got 'hot'"),
    ({"method": "code", "warp_factor": 9}, r"method 'code' does not take parameter\(s\) warp_factor; it takes "
                                           "draft_steps, training_free, refiner_cfg, refiner_temperature"),
    ({"method": "code", "draft_steps": 4}, r"draft_steps must be an int in \[1, 3\]"),
    ({"method": "code", "draft_steps": 0}, "draft_steps"),
    ({"cfg_scale": -1.0}, "cfg_scale"),
    ({"temperature": [1.0, 1.0]}, "4 scales"),
    ({"top_p": 1.5}, "top_p"),
    ({"seed": "x"}, "seed"),
])
def test_bad_arguments(pipe, kwargs, match):
    with pytest.raises(InputError, match=match):
        pipe.generate([0], **kwargs)


@pytest.mark.parametrize("labels", [[], [5], ["Bag"], [1.5]])
def test_bad_labels(pipe, labels):
    with pytest.raises(InputError):
        pipe.generate(labels)


def test_mismatched_parts_and_missing_files(folder, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    save_msvq(tiny_model(), other / "vq.safetensors")
    save_var(tiny_var(0, vocab_size=64), other / "var.safetensors")
    with pytest.raises(InputError, match="not trained together"):
        ScalePipeline.from_pretrained(other)
    with pytest.raises(ModelNotFoundError):
        ScalePipeline.from_pretrained(tmp_path / "nothing")
    with pytest.raises(ModelNotFoundError, match="refiner"):
        ScalePipeline.from_pretrained(folder, refiner=tmp_path / "missing.safetensors")
    with pytest.raises(ModelNotFoundError, match="unknown built-in"):
        ScalePipeline.from_pretrained("builtin:imagenet-var")


def test_builtin_generates_every_class_with_both_refiners():
    assert all(p.is_file() for p in BUILTIN_SCALE_FILES.values())
    pipe = ScalePipeline.from_pretrained(BUILTIN_SCALE)
    assert sorted(pipe.specialised) == [6, 7] and pipe.class_names[7] == "Sneaker"
    for training_free, n in ((True, 6), (False, 6), (False, 7)):
        out = pipe.generate(list(range(10)), "code", draft_steps=n, seed=0, training_free=training_free)
        assert len(out.images) == 10 and out.images[0].size == (64, 64)
        assert (out.stats.nfe, out.stats.draft_passes) == (n, 10 - n)


def test_specialised_refiners_are_found_and_chosen(folder, tmp_path):
    special = tmp_path / "special"
    special.mkdir()
    for name in ("vq", "var", "refiner"):
        (special / f"{name}.safetensors").write_bytes((folder / f"{name}.safetensors").read_bytes())
    save_var(tiny_var(2, depth=1, embed_dim=16, num_heads=2), special / "refiner_code2.safetensors")
    pipe = ScalePipeline.from_pretrained(special)
    assert sorted(pipe.specialised) == [2]
    free = pipe.generate([0, 1], "code", draft_steps=2, seed=0)
    tuned = pipe.generate([0, 1], "code", draft_steps=2, training_free=False, seed=0)
    assert torch.equal(free.tokens[:, :5], tuned.tokens[:, :5])              # the same large-model scales
    assert not torch.equal(free.tokens[:, 5:], tuned.tokens[:, 5:])          # another refiner after them
    # a later hand-off takes the refiner specialised for N = 2: it was distilled on every scale N = 3 draws
    later = pipe.generate([0, 1], "code", draft_steps=3, training_free=False, seed=0)
    same = ScalePipeline(pipe.model, pipe.vq, pipe.refiner, specialised={3: pipe.specialised[2]})
    assert torch.equal(later.tokens, same.generate([0, 1], "code", draft_steps=3, training_free=False, seed=0).tokens)
    assert not torch.equal(later.tokens, pipe.generate([0, 1], "code", draft_steps=3, seed=0).tokens)
    with pytest.raises(InputError, match="no refiner specialised for draft_steps=1 or an earlier hand-off"):
        pipe.generate([0], "code", draft_steps=1, training_free=False)
    with pytest.raises(InputError, match="training_free"):
        pipe.generate([0], "ar", training_free=False)
    with pytest.raises(ModelNotFoundError, match="specialised"):
        ScalePipeline.from_pretrained(folder, specialised={2: tmp_path / "nope.safetensors"})


def test_next_scale_decoding_runs_on_a_cuda_device_without_host_reads(folder):
    """The scale loop and CoDe on the emulated GPU of tests/emulated_cuda.py: no stray CPU tensor, and the
    host never waits inside the loop (sampling, guidance and f_hat stay on the device)."""
    from tests.emulated_cuda import emulated_cuda

    with emulated_cuda() as report:
        pipe = ScalePipeline.from_pretrained(folder, device="cuda")
        for method, params in (("ar", {}), ("code", {"draft_steps": 2}), ("ar-small", {})):
            before = len(report.syncs)
            out = pipe.generate([0, 3], method, seed=0, cfg_scale=2.0, top_k=8, top_p=0.9, **params)
            assert out.indices[0].device.type == "cuda" and len(out.images) == 2
            reads = report.syncs[before:]
            assert reads == ["cpu"], (method, reads)     # the images' read-back only, nothing per scale
