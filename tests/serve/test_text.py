"""`/v1/completions` and `/v1/chat/completions` on SmolLM2-135M-Instruct (with its shipped draft): sixteen
concurrent greedy requests decoded together return, token for token, what each returns alone; streamed text is
the text returned whole, several tokens an event with a speculative method; bad requests get one line; the
official `openai` client, streamed and not."""

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
from fastapi.testclient import TestClient

from mmaccel.serve.app import ServeConfig, create_app
from tests.serve.conftest import WAIT_S, Gated, served, until

MODEL = "smollm2-135m-instruct"
QUESTIONS = ["Name a colour.", "What is two plus two?", "Say hello.", "Name a river in Europe.",
             "What is the capital of France?", "Give one word for happy.", "Count to three.", "Name a fruit."]


@pytest.fixture(scope="module")
def gated(smollm2):
    return Gated(smollm2, "generate_ids")


@pytest.fixture(scope="module")
def client(gated):
    app = create_app(ServeConfig(models=(MODEL,), pipelines={MODEL: gated}, max_rows=16))
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def _chat(question: str, **fields) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": question}], "temperature": 0, **fields}


def _events(response) -> list:
    """The JSON payloads of a server-sent event stream, `[DONE]` as the string."""
    out = []
    for block in response.text.split("\n\n"):
        if block.strip():
            assert block.startswith("data: "), block
            data = block[len("data: "):]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_sixteen_requests_decoded_together_return_what_each_returns_alone(client, gated, smollm2):
    requests = [_chat(q, max_tokens=8 + 3 * (i % 4), method="speculative", method_params={"k": 3})
                for i, q in enumerate(QUESTIONS * 2)]
    once = {}                                 # each (question, max_tokens) is asked twice
    for body in requests[:len(QUESTIONS)]:
        ids = smollm2.encode_messages(body["messages"])
        once[body["messages"][0]["content"], body["max_tokens"]] = smollm2.generate_ids(
            [ids], "ar", max_new_tokens=body["max_tokens"]).tokens[0]
    alone = [once[body["messages"][0]["content"], body["max_tokens"]] for body in requests]
    gated.batches.clear()
    gated.hold.clear()                        # the first request's call waits: the other fifteen queue behind it
    worker = client.app.state.server.workers[MODEL]
    post = lambda body: client.post("/v1/chat/completions", json=body)  # noqa: E731
    with ThreadPoolExecutor(len(requests)) as pool:
        first = pool.submit(post, requests[0])
        until(lambda: gated.batches)
        rest = [pool.submit(post, body) for body in requests[1:]]
        until(lambda: worker.depth == len(rest))
        gated.hold.set()
        together = [f.result(WAIT_S).json() for f in [first, *rest]]
    assert gated.batches == [1, 16]           # the fifteen waiting requests shared one call (and a spare row)
    for body, tokens, answer in zip(requests, alone, together):
        choice = answer["choices"][0]
        want = smollm2.tokenizer.decode(tokens, skip_special_tokens=True)
        assert choice["message"] == {"role": "assistant", "content": want}, (body, answer)
        assert answer["usage"]["completion_tokens"] == len(tokens)
        assert choice["finish_reason"] == ("stop" if tokens[-1] == smollm2.tokenizer.eos_token_id else "length")
        assert answer["object"] == "chat.completion" and answer["mmaccel"]["method"] == "speculative"


@pytest.mark.parametrize("method", ["ar", "speculative"])
def test_a_streamed_chat_is_the_text_returned_whole(client, method):
    body = _chat("Tell me a short story about a cat.", max_tokens=24, method=method)
    whole = client.post("/v1/chat/completions", json=body).json()
    with client.stream("POST", "/v1/chat/completions", json=body | {"stream": True,
                                                                    "stream_options": {"include_usage": True}}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        r.read()
        events = _events(r)
    assert events[-1] == "[DONE]" and events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    chunks = [e for e in events[1:-1] if e["choices"]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == whole["choices"][0]["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    pieces = [c for c in chunks if c["choices"][0]["delta"].get("content")]
    assert len(pieces) >= 5                   # sent as it was decoded, not at the end
    assert events[-2]["usage"] == whole["usage"] and events[-2]["choices"] == []


def test_a_streamed_completion_and_n_rows(client, smollm2):
    body = {"model": MODEL, "prompt": "The river flows", "max_tokens": 12, "temperature": 0, "n": 2}
    whole = client.post("/v1/completions", json=body).json()
    ids = smollm2.tokenizer("The river flows")["input_ids"]
    want = smollm2.tokenizer.decode(smollm2.generate_ids([ids], max_new_tokens=12).tokens[0], skip_special_tokens=True)
    assert [c["text"] for c in whole["choices"]] == [want, want] and whole["object"] == "text_completion"
    with client.stream("POST", "/v1/completions", json=body | {"stream": True}) as r:
        r.read()
        events = _events(r)
    for row in (0, 1):
        assert "".join(e["choices"][0]["text"] for e in events[:-1] if e["choices"][0]["index"] == row) == want


def test_sampling_with_a_seed_does_not_depend_on_other_requests(client):
    body = _chat("Name an animal.", max_tokens=10, temperature=1.0, seed=7)
    first = client.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
    with ThreadPoolExecutor(3) as pool:
        others = [pool.submit(client.post, "/v1/chat/completions", json=_chat(q, max_tokens=10, temperature=1.0))
                  for q in QUESTIONS[:2]]
        again = client.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
        assert all(f.result(WAIT_S).status_code == 200 for f in others)
    assert again == first


BAD = [  # (route, body, start of the one-line message)
    ("/v1/chat/completions", {"model": MODEL}, "the request needs 'messages'"),
    ("/v1/chat/completions", {"model": MODEL, "messages": []}, "messages must be a non-empty list"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "robot", "content": "hi"}]},
     "every message needs a role"),
    ("/v1/chat/completions", _chat("hi", max_tokens=0), "max_tokens must be at least 1"),
    ("/v1/chat/completions", _chat("hi", temperature=3), "temperature must be in [0, 2]"),
    ("/v1/chat/completions", _chat("hi", stop=["\n"]), "stop sequences are not supported"),
    ("/v1/chat/completions", _chat("hi", n=17), "n is 17"),
    ("/v1/chat/completions", _chat("hi", method="fastest"), "unknown method 'fastest'"),
    ("/v1/chat/completions", _chat("hi", method="speculative", method_params={"k": 0}), "k must be"),
    ("/v1/chat/completions", _chat("hi", tools=[]), "unknown field(s) tools"),
    ("/v1/chat/completions", _chat("hi", model="whisper-1"), "model 'whisper-1' is not served here"),
    ("/v1/completions", {"model": MODEL, "prompt": [1, 2, 3]}, "prompt must be a string"),
    ("/v1/completions", {"model": MODEL, "prompt": "hi", "echo": True}, "echo is not supported"),
    ("/v1/images/generations", {"model": MODEL, "prompt": "a cat"}, "model 'smollm2-135m-instruct' is a text model"),
]


@pytest.mark.parametrize("route,body,message", BAD)
def test_bad_requests_get_one_line_and_the_server_goes_on(client, route, body, message):
    r = client.post(route, json=body)
    error = r.json()["error"]
    assert r.status_code == 400 and error["message"].startswith(message), error
    assert "\n" not in error["message"]
    assert client.get("/healthz").json()["status"] == "ok"


def test_a_body_that_is_not_json(client):
    r = client.post("/v1/chat/completions", content=b"{messages: oops", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("the request body is not valid JSON")


def test_the_official_openai_client(gated):
    openai = pytest.importorskip("openai")
    with served(create_app(ServeConfig(models=(MODEL,), pipelines={MODEL: gated}))) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        messages = [{"role": "user", "content": "Name a colour."}]
        whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0)
        assert whole.choices[0].message.content and whole.usage.completion_tokens <= 12
        streamed = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0,
                                                  stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in streamed) == whole.choices[0].message.content
        completion = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=0,
                                               extra_body={"method": "speculative"})
        assert completion.choices[0].text and completion.choices[0].finish_reason in ("stop", "length")
        with pytest.raises(openai.BadRequestError, match="stop sequences are not supported"):
            client.chat.completions.create(model=MODEL, messages=messages, stop=["."])


class Stepped:
    """The pipeline, calling `on_step(call, step)` after every decoding step of its calls (numbered from 1)."""

    def __init__(self, pipeline, on_step):
        self.pipeline, self.on_step, self.calls = pipeline, on_step, []

    def generate_ids(self, rows, *args, on_tokens=None, **kwargs):
        self.calls.append(len(rows))
        call, steps = len(self.calls), iter(range(1, 10**6))

        def heard(tokens):
            self.on_step(call, next(steps))
            if on_tokens is not None:
                on_tokens(tokens)

        return self.pipeline.generate_ids(rows, *args, on_tokens=heard, **kwargs)

    def __getattr__(self, name):
        return getattr(self.pipeline, name)


def test_a_request_joins_a_call_in_progress_and_is_answered_while_it_decodes(smollm2):
    """The second call holds at its first step until a third request queues, and at its 20th until that request
    has been answered: the request joined the call in progress (its spare row) and left before the call ended."""
    import threading

    queued, answered = threading.Event(), threading.Event()
    bodies = {name: _chat(q, max_tokens=n) for name, q, n in (
        ("first", "Say hello.", 2), ("long", "Tell me a long story about a brave cat.", 40),
        ("short", "Name a colour.", 6), ("joiner", "What is two plus two?", 6))}
    alone = {name: client_free_answer(smollm2, body) for name, body in bodies.items()}
    assert len(alone["long"]) > 30                       # the long row decodes past the 20th step

    def on_step(call, step):
        if call == 1 and step == 1:
            until(lambda: worker.depth == 2)             # long and short wait behind the first call
        if call == 2 and step == 1:
            assert queued.wait(WAIT_S)
        if call == 2 and step == 20:
            assert answered.wait(WAIT_S), "the joining request was not answered while its call decoded"

    stepped = Stepped(smollm2, on_step)
    app = create_app(ServeConfig(models=(MODEL,), pipelines={MODEL: stepped}, max_rows=4))
    with TestClient(app, raise_server_exceptions=False) as client, ThreadPoolExecutor(4) as pool:
        worker = client.app.state.server.workers[MODEL]
        post = lambda name: client.post("/v1/chat/completions", json=bodies[name]).json()  # noqa: E731
        first = pool.submit(post, "first")
        until(lambda: stepped.calls)
        long, short = pool.submit(post, "long"), pool.submit(post, "short")
        until(lambda: len(stepped.calls) == 2)
        joiner = pool.submit(post, "joiner")
        until(lambda: worker.depth == 1)
        queued.set()
        got = joiner.result(WAIT_S)
        answered.set()
        answers = {"first": first.result(WAIT_S), "long": long.result(WAIT_S), "short": short.result(WAIT_S),
                   "joiner": got}
    assert stepped.calls == [1, 4]                       # the second call: long, short and two spare rows
    for name, answer in answers.items():
        want = smollm2.tokenizer.decode(alone[name], skip_special_tokens=True)
        assert answer["choices"][0]["message"]["content"] == want, name


def client_free_answer(pipeline, body) -> list[int]:
    ids = pipeline.encode_messages(body["messages"])
    return pipeline.generate_ids([ids], "ar", max_new_tokens=body["max_tokens"]).tokens[0]
