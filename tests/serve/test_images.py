"""`/v1/images/generations` on the shipped Fashion-MNIST models: a seeded request draws exactly what the
pipeline draws for its class and seed, unseeded requests share a call (each keeping its own `n` rows), the
next-scale and continuous pipelines behind the same route, bad requests get one line, and the official client."""

import base64
import io
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from mmaccel.serve.app import ServeConfig, create_app
from tests.serve.conftest import WAIT_S, Gated, served, until

MODEL = "llamagen-fashion-mnist"


@pytest.fixture(scope="module")
def llamagen():
    from mmaccel.image.pipeline import ImagePipeline

    return ImagePipeline.from_pretrained()


@pytest.fixture(scope="module")
def gated(llamagen):
    return Gated(llamagen, "generate")


@pytest.fixture(scope="module")
def client(gated):
    app = create_app(ServeConfig(models=(MODEL, "var-fashion-mnist", "mar-fashion-mnist"), pipelines={MODEL: gated}))
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def _pixels(item: dict) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(item["b64_json"]))).convert("RGB"))


def test_a_seeded_request_draws_what_the_pipeline_draws(client, llamagen):
    r = client.post("/v1/images/generations", json={"model": MODEL, "prompt": "trouser", "n": 2, "seed": 11,
                                                    "method": "speculative", "cfg_scale": 2.0})
    body = r.json()
    assert r.status_code == 200, body
    want = llamagen.generate([1, 1], "speculative", seed=11, cfg_scale=2.0).images
    assert len(body["data"]) == 2 and body["size"] == "64x64"
    for item, image in zip(body["data"], want):
        assert np.array_equal(_pixels(item), np.asarray(image.convert("RGB")))
    assert body["mmaccel"] == {"method": "speculative", "params": {}, "seed": 11, "class": 1, "cfg_scale": 2.0}


def _post(client, prompt, n):
    return client.post("/v1/images/generations", json={"model": MODEL, "prompt": prompt, "n": n}).json()


def test_unseeded_requests_share_a_call(gated):
    """Per-call batching (--per-call): requests that queue while a call draws share the next call."""
    app = create_app(ServeConfig(models=(MODEL,), pipelines={MODEL: gated}, continuous=False))   # draws a warm-up
    gated.batches.clear()
    gated.hold.clear()
    with TestClient(app, raise_server_exceptions=False) as client, ThreadPoolExecutor(4) as pool:
        worker = client.app.state.server.workers[MODEL]
        first = pool.submit(_post, client, "0", 1)
        until(lambda: gated.batches)
        rest = [pool.submit(_post, client, p, n) for p, n in (("Dress", 2), ("7", 1), ("bag", 3))]
        until(lambda: worker.depth == len(rest))
        gated.hold.set()
        answers = [f.result(WAIT_S) for f in [first, *rest]]
    assert gated.batches == [1, 6]
    assert [len(a["data"]) for a in answers] == [1, 2, 1, 3]
    assert [a["mmaccel"]["class"] for a in answers] == [0, 3, 7, 8]
    assert len({a["mmaccel"]["seed"] for a in answers[1:]}) == 1       # one call, one seed


class Released:
    """The pipeline, each of its first two joined calls waiting for its own `release`."""

    def __init__(self, pipeline):
        self.pipeline, self.batches, self.release = pipeline, [], [threading.Event(), threading.Event()]

    def generate_joined(self, labels, *args, **kwargs):
        self.batches.append(len(labels))
        assert self.release[len(self.batches) - 1].wait(WAIT_S)
        return self.pipeline.generate_joined(labels, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.pipeline, name)


def test_unseeded_requests_join_a_call_in_progress(llamagen):
    """The first call (one image on an idle server) holds until three requests queue; the second (their six
    images and two spare rows) holds until a fifth request queues, which takes the spare rows at the first step:
    two calls in all, the fifth request drawn with the second call's seed."""
    joined = Released(llamagen)
    app = create_app(ServeConfig(models=(MODEL,), pipelines={MODEL: joined}))
    with TestClient(app, raise_server_exceptions=False) as client, ThreadPoolExecutor(5) as pool:
        worker = client.app.state.server.workers[MODEL]
        first = pool.submit(_post, client, "0", 1)
        until(lambda: joined.batches)
        rest = [pool.submit(_post, client, p, n) for p, n in (("Dress", 2), ("7", 1), ("bag", 3))]
        until(lambda: worker.depth == len(rest))
        joined.release[0].set()
        until(lambda: len(joined.batches) == 2)
        joiner = pool.submit(_post, client, "Sandal", 2)
        until(lambda: worker.depth == 1)
        joined.release[1].set()
        answers = [f.result(WAIT_S) for f in [first, *rest, joiner]]
    assert joined.batches == [1, 8]
    assert [len(a["data"]) for a in answers] == [1, 2, 1, 3, 2]
    assert [a["mmaccel"]["class"] for a in answers] == [0, 3, 7, 8, 5]
    assert len({a["mmaccel"]["seed"] for a in answers[1:]}) == 1       # one call, one seed


@pytest.mark.parametrize("model", ["var-fashion-mnist", "mar-fashion-mnist"])
def test_the_other_image_pipelines(client, model):
    body = client.post("/v1/images/generations", json={"model": model, "prompt": "sneaker", "seed": 3}).json()
    assert len(body["data"]) == 1 and _pixels(body["data"][0]).shape == (64, 64, 3)
    again = client.post("/v1/images/generations", json={"model": model, "prompt": "7", "seed": 3}).json()
    assert again["data"] == body["data"]


BAD = [  # (body fields, start of the one-line message)
    ({"prompt": "a cat"}, "prompt 'a cat' names no class of this model"),
    ({"prompt": "12"}, "class label 12 out of range"),
    ({"prompt": "Coat", "n": 9}, "n is 9"),
    ({"prompt": "Coat", "n": 0}, "n must be at least 1"),
    ({"prompt": "Coat", "response_format": "url"}, "response_format 'url' is not supported"),
    ({"prompt": "Coat", "size": "1024x1024"}, "size '1024x1024' is not drawn by"),
    ({"prompt": "Coat", "cfg_scale": -1}, "cfg_scale must be in"),
    ({"prompt": "Coat", "method": "fastest"}, "unknown method 'fastest'"),
    ({"prompt": "Coat", "method": "speculative", "method_params": {"k": 0}}, "k must be"),
    ({"prompt": "Coat", "quality": "hd"}, "unknown field(s) quality"),
    ({"prompt": "Coat", "seed": "x"}, "seed must be an integer"),
    ({}, "the request needs 'prompt'"),
]


@pytest.mark.parametrize("fields,message", BAD)
def test_bad_requests_get_one_line_and_the_server_goes_on(client, fields, message):
    r = client.post("/v1/images/generations", json={"model": MODEL, **fields})
    error = r.json()["error"]
    assert r.status_code == 400 and error["message"].startswith(message), error
    assert "\n" not in error["message"]
    assert client.get("/healthz").json()["status"] == "ok"


def test_the_official_openai_client(gated):
    openai = pytest.importorskip("openai")
    with served(create_app(ServeConfig(models=(MODEL,), pipelines={MODEL: gated}))) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        images = client.images.generate(model=MODEL, prompt="Sandal", n=2, response_format="b64_json",
                                        extra_body={"seed": 5, "method": "sjd"})
        assert len(images.data) == 2 and all(base64.b64decode(d.b64_json)[:4] == b"\x89PNG" for d in images.data)
        with pytest.raises(openai.BadRequestError, match="names no class"):
            client.images.generate(model=MODEL, prompt="a cat in a hat")
