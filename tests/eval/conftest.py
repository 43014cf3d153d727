"""Fixtures of the eval tests: Fashion-MNIST test images as PNG folders, the built-in image
pipeline, a manifest of short real clips, and a launcher for `torchrun` runs of the CLI."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
               "GROUP_RANK", "ROLE_RANK", "TORCHELASTIC_RUN_ID")


@pytest.fixture(scope="session")
def fashion_test_images():
    """The first 500 Fashion-MNIST test images, uint8 [500, 28, 28] (skipped when the data set is missing)."""
    from mmaccel.errors import ModelNotFoundError
    from mmaccel.image.data import load_fashion_mnist

    try:
        images, _ = load_fashion_mnist("test")
    except ModelNotFoundError as err:
        pytest.skip(str(err))
    return images[:500].numpy()


def upsample64(images: np.ndarray) -> np.ndarray:
    """Grey uint8 [N, 28, 28] -> [N, 64, 64], the image models' resolution (the path `reference_stats` takes)."""
    import torch

    from mmaccel.image.data import to_model_images

    x = to_model_images(torch.from_numpy(images), 64)[:, 0]
    return ((x + 1) * 127.5).round().to(torch.uint8).numpy()


def write_pngs(folder: Path, images: np.ndarray, prefix: str = "img") -> list[Path]:
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, image in enumerate(images):
        paths.append(folder / f"{prefix}_{i:04d}.png")
        Image.fromarray(image).save(paths[-1])
    return paths


@pytest.fixture(scope="session")
def fashion_pipe():
    from mmaccel.image.pipeline import ImagePipeline

    return ImagePipeline.from_pretrained("builtin:fashion-mnist")


@pytest.fixture(scope="session")
def short_clips_manifest(tmp_path_factory):
    """A manifest of the 4 shortest real clips with transcripts (cards, ALSA)."""
    from mmaccel.errors import ModelNotFoundError
    from mmaccel.speech.data import real_utterances, write_manifest

    try:
        utts = real_utterances()
    except ModelNotFoundError as err:
        pytest.skip(str(err))
    cards = sorted((u for u in utts if u.id.startswith("cards")), key=lambda u: u.duration)[:4]
    return write_manifest(tmp_path_factory.mktemp("clips") / "clips.jsonl", cards)


def one_line_error(capsys, match: str) -> str:
    err = capsys.readouterr().err.strip()
    lines = [line for line in err.splitlines() if line.startswith("mmaccel: error:")]
    assert len(lines) == 1 and match in lines[0], err
    return lines[0]


def torchrun(argv: list[str], nproc: int = 2, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m torch.distributed.run --standalone --nproc-per-node N -m mmaccel.cli ARGV` on CPU (gloo),
    one thread per process."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env.update(OMP_NUM_THREADS="1", MMACCEL_DIST_BACKEND="gloo",
               PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "mmaccel.cli", *argv]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
