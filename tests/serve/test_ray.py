"""The app on Ray Serve (`mmaccel serve --ray`): two replicas of Whisper tiny.en behind Ray's proxy on loopback both
answer, with what the pipeline returns; a replica killed while requests are in flight costs those requests a clean
HTTP error at worst (never a hang), and Serve replaces it. Also the CLI's checks and the shipped config file."""

import socket
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

import pytest
import yaml

from mmaccel.cli import main
from mmaccel.errors import InputError
from mmaccel.serve.app import ServeConfig
from tests.serve.conftest import WAIT_S
from tests.speech.test_pipeline import files  # noqa: F401  (fixture)

ray = pytest.importorskip("ray")
from ray import serve  # noqa: E402

from mmaccel.serve import ray_app  # noqa: E402

MODEL = "whisper-tiny.en"
YAML = Path(__file__).resolve().parents[2] / "docs" / "ray_serve.yaml"


def _until(condition, what: str) -> None:
    """Poll `condition()` (the cluster's progress) every 0.2 s, failing after WAIT_S with `what` it waited for."""
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {WAIT_S} s waiting for {what}"
        time.sleep(0.2)


@pytest.mark.parametrize("argv,message", [
    (["--replicas", "2"], "--replicas, --replica-cpus and --ray-address need --ray"),
    (["--ray-address", "auto"], "--replicas, --replica-cpus and --ray-address need --ray"),
    (["--ray", "--replicas", "0"], "--replicas must be >= 1, got 0"),
    (["--ray", "--replica-cpus", "0"], "a replica needs cpus > 0, got 0.0"),
    (["--ray", "--port", "0"], "Ray Serve needs a fixed port"),
    (["--ray", "--models", "whisper-9"], "unknown model(s) whisper-9"),
])
def test_the_cli_checks_its_ray_flags(monkeypatch, capsys, argv, message):
    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("the CLI started Ray before checking its flags"))
    assert main(["serve", *argv]) == 2
    assert message in capsys.readouterr().err


def test_without_ray_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(InputError, match=r"^Ray Serve is not installed: pip install mmaccel\[serve\]$"):
        ray_app.build_deployment(ServeConfig(models=(MODEL,)))


def test_config_file_args_become_a_serve_config():
    config, replicas = ray_app.config_from_args({"models": "whisper-base, whisper-tiny.en", "max_rows": "4",
                                                 "timeout_s": 30, "replicas": "3"})
    assert config.models == ("whisper-base", "whisper-tiny.en") and config.max_rows == 4 and config.timeout_s == 30.0
    assert replicas == 3 and ray_app.config_from_args({"models": [MODEL]})[0].models == (MODEL,)
    with pytest.raises(InputError, match="^unknown args pipelines, workers; the app takes replicas, models"):
        ray_app.config_from_args({"workers": 2, "pipelines": {}})
    with pytest.raises(InputError, match=r"^args.max_queue: cannot read 'many' as int$"):
        ray_app.config_from_args({"max_queue": "many"})


def test_the_shipped_config_file_is_valid_and_its_builder_imports():
    from ray.serve.schema import ServeDeploySchema

    schema = ServeDeploySchema.parse_obj(yaml.safe_load(YAML.read_text()))
    (app,) = schema.applications
    module, name = app.import_path.split(":")
    builder = getattr(__import__(module, fromlist=[name]), name)
    assert builder is ray_app.app_builder
    assert isinstance(builder(app.args), serve.Application)
    assert [d.name for d in app.deployments] == [ray_app.DEPLOYMENT]


@pytest.fixture(scope="module")
def url():
    """Two replicas of the app on a local Ray (2 CPUs, no dashboard), its proxy on a free loopback port."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))                 # Ray's proxy takes no port 0: find a free one, then free it
    port = sock.getsockname()[1]
    sock.close()
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=200 * 2**20, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(ray_app.build_deployment(ServeConfig(models=(MODEL,)), replicas=2), name=ray_app.APP_NAME,
                  route_prefix="/")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def expected(tiny_en_asr, files):  # noqa: F811
    """Each clip's text from the pipeline called directly (first in each test: it skips where the weights are absent,
    before Ray starts)."""
    return {path: tiny_en_asr.transcribe(path).texts[0].strip() for path in files}


def _post(url: str, path: str):
    import httpx

    with open(path, "rb") as f:
        return httpx.post(f"{url}/v1/audio/transcriptions", data={"model": MODEL},
                          files={"file": ("a.wav", f.read(), "audio/wav")}, timeout=WAIT_S)


def _replicas_running() -> int:
    deployment = serve.status().applications[ray_app.APP_NAME].deployments[ray_app.DEPLOYMENT]
    return deployment.replica_states.get("RUNNING", 0)


def test_two_replicas_answer_what_the_pipeline_returns(expected, files, url):  # noqa: F811
    seen = set()
    with ThreadPoolExecutor(4) as pool:
        for _ in range(5):                      # Ray routes each request to the less loaded of the replicas
            paths = list(files)
            for path, r in zip(paths, pool.map(lambda p: _post(url, p), paths)):
                assert r.status_code == 200, r.text
                assert r.json() == {"text": expected[path]}
                seen.add(r.headers[ray_app.REPLICA_HEADER])
            if len(seen) == 2:
                break
    assert len(seen) == 2, f"only replica(s) {seen} answered"


def test_the_official_client_through_the_proxy(expected, files, url):  # noqa: F811
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=WAIT_S)
    with open(files[0], "rb") as f:
        assert client.audio.transcriptions.create(model="whisper-1", file=f).text == expected[files[0]]


def _replica_actor(replica: str):
    """The actor of the replica whose id a response named (Serve names it SERVE_REPLICA::app#deployment#id)."""
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == "serve"]
    (name,) = [n for n in names if n.startswith("SERVE_REPLICA::") and n.endswith(f"#{replica}")]
    return ray.get_actor(name, namespace="serve")


@pytest.mark.slow      # the default suite's time budget
def test_a_replica_killed_under_load_fails_cleanly_and_is_replaced(expected, files, url):  # noqa: F811
    paths = files * 2
    with ThreadPoolExecutor(len(paths)) as pool:
        futures = [pool.submit(_post, url, p) for p in paths]
        done, pending = wait(futures, timeout=WAIT_S, return_when=FIRST_COMPLETED)
        assert done and pending, "no request finished in time, or all finished at once"
        # the replica that answered first still holds its share of the others (queued behind that call)
        victim = next(iter(done)).result().headers[ray_app.REPLICA_HEADER]
        ray.kill(_replica_actor(victim), no_restart=True)
        answers = [f.result(WAIT_S) for f in futures]       # httpx's timeout bounds each: an answer or a failure
    for path, r in zip(paths, answers):
        if r.status_code == 200:
            assert r.json() == {"text": expected[path]}
        else:                                   # Ray's proxy answers a request its replica died under with a 500
            assert r.status_code in (500, 503) and "\n" not in r.text.strip() and "Traceback" not in r.text, \
                (r.status_code, r.text[:300])

    _until(lambda: _replicas_running() == 2, "Serve to replace the killed replica")
    seen = set()

    def answered_by_two_live_replicas() -> bool:
        r = _post(url, files[0])                 # until the proxy learns of the death, it may still pick the victim
        assert r.status_code in (200, 500), (r.status_code, r.text[:300])
        if r.status_code == 200:
            assert r.json() == {"text": expected[files[0]]}
            seen.add(r.headers[ray_app.REPLICA_HEADER])
        return len(seen) == 2

    _until(answered_by_two_live_replicas, "both the surviving and the new replica to answer")
    assert victim not in seen
    with ThreadPoolExecutor(len(files)) as pool:
        for path, r in zip(files, pool.map(lambda p: _post(url, p), files)):
            assert r.status_code == 200 and r.json() == {"text": expected[path]}, r.text
