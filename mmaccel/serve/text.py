"""`/v1/completions` and `/v1/chat/completions`: OpenAI's text requests over `TextPipeline`, streamed as
server-sent events with `stream: true`, plus our `method` and `method_params` fields.

Requests with equal options (method and parameters, temperature, top_p) share a call, `n` completions of a
request taking `n` rows. With a method that can (plain decoding, a draft model, prompt lookup: `Method.joins`),
a request that arrives while a call decodes joins it at the next step where a row has ended, and each request is
answered as soon as its own rows end (continuous batching over the core's per-row cache: `RowFeed`); a call
started while requests were queueing opens as many rows again (up to `max_rows`) for those to come. Other methods decode each
call's requests to the end together (up to the largest `max_tokens` among them, each request keeping its own).
A sampling request with a `seed` is decoded in a call of its own, so its text does not depend on other requests.
A streamed request hears its rows' tokens after every decoding step, whatever the method
(`mmaccel.core.driver.listen_to_emission`): a speculative method sends several tokens a step.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import json
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from mmaccel.errors import check
from mmaccel.serve.batching import Job, JoinedRows, Joining, ModelWorker
from mmaccel.serve.fields import check_fields, method_params, number, optional_int, optional_str, params_of, positive_int

COMMON = {"model", "max_tokens", "temperature", "top_p", "n", "stream", "stream_options", "seed", "stop", "user",
          "logprobs", "frequency_penalty", "presence_penalty", "method", "method_params"}
FIELDS = {"completion": COMMON | {"prompt", "echo"}, "chat": COMMON | {"messages", "max_completion_tokens"}}
DEFAULT_MAX_TOKENS = {"completion": 16, "chat": 256}      # OpenAI's 16 for completions; chat: a CPU-sized cap
MOST_TOKENS = 4096
JOIN_PROMPT_TOKENS = 512    # cache room a call keeps for joining prompts beyond its first rows' longest
_ALONE = itertools.count()


@dataclass(frozen=True)
class TextOptions:
    """What a text call is decoded with: requests with equal options share a call."""

    method: str
    params: tuple[tuple[str, Any], ...]
    temperature: float
    top_p: float
    seed: int
    alone: int | None = None        # set for a seeded sampling request: a key no other request has


@dataclass
class TextRequest:
    """A completion or chat request as `parse_request` reads it: the model it names, its prompt (text, or the chat's
    messages), the `n` completions asked for and the most tokens of each, whether it streams (and sends its usage
    in the stream), and the options it is decoded with."""

    kind: str                       # completion or chat
    model: str
    prompt: Any                     # the prompt text, or the chat's messages
    n: int
    max_tokens: int
    stream: bool
    usage_in_stream: bool
    options: TextOptions


@dataclass
class TextJob:
    """One request's part of a call: its prompt ids, rows and tokens, and where its streamed tokens go."""

    ids: list[int]
    n: int
    max_tokens: int
    stream: TokenStream | None = None


@dataclass
class Choice:
    """One completion: its tokens (at most `max_tokens`, ending with the end-of-text token where one came), their
    text (special tokens skipped) and why it ended."""

    tokens: list[int]
    text: str
    finish_reason: str              # stop (an end of text) or length (max_tokens)


@dataclass
class TextResult:
    """What a text request is answered with: its `n` choices, its prompt's length in tokens and the target passes
    that committed its tokens."""

    choices: list[Choice]
    prompt_tokens: int
    passes: int                     # target passes that committed its tokens (summed over its rows)


@dataclass
class TokenStream:
    """A streamed request's rows' tokens so far, handed from the worker's thread to the request's event loop."""

    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)

    def push(self, rows: list[list[int]]) -> None:
        """Queue `rows` (each row's tokens so far) on the request's event loop; safe from any thread."""
        self.loop.call_soon_threadsafe(self.queue.put_nowait, rows)


def _check_neutral(body: dict) -> None:
    """Fields OpenAI clients send with neutral values, which this server takes only so."""
    check(body.get("stop") in (None, "", []), "stop sequences are not supported; leave 'stop' out")
    check(body.get("echo") in (None, False), "echo is not supported; leave it out or false")
    check(body.get("logprobs") in (None, False), "logprobs are not supported; leave them out")
    for name in ("frequency_penalty", "presence_penalty"):
        check(body.get(name) in (None, 0, 0.0), f"{name} is not supported; leave it out or 0")


def _messages(body: dict) -> list[dict]:
    """The chat's messages with string contents (a content given as parts keeps its text parts)."""
    messages = body.get("messages")
    check(isinstance(messages, list) and messages, "messages must be a non-empty list of {role, content}")
    out = []
    for m in messages:
        check(isinstance(m, dict), f"every message must be an object, got {json.dumps(m)[:60]}")
        content = m.get("content")
        if isinstance(content, list):
            check(all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                      for p in content), "a message's content parts must all be text parts ({type: text, text})")
            content = "".join(p["text"] for p in content)
        out.append({"role": m.get("role"), "content": content})
    return out


def parse_request(body: Any, kind: str, default_method: str, max_rows: int) -> TextRequest:
    """The request of a JSON body (`kind`: completion or chat); InputError with one line for anything off."""
    check_fields(body, FIELDS[kind], "model", "prompt" if kind == "completion" else "messages")
    _check_neutral(body)
    if kind == "completion":
        prompt = body["prompt"]
        check(isinstance(prompt, str) or (isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str)),
              "prompt must be a string (one prompt a request)")
        prompt = prompt if isinstance(prompt, str) else prompt[0]
    else:
        prompt = _messages(body)
    n = positive_int(body, "n", 1)
    check(n <= max_rows, f"n is {n}; this server decodes at most {max_rows} completions per request")
    most = body.get("max_completion_tokens") if body.get("max_completion_tokens") is not None else None
    max_tokens = positive_int({"max_tokens": most if most is not None else body.get("max_tokens")}, "max_tokens",
                              DEFAULT_MAX_TOKENS[kind])
    check(max_tokens <= MOST_TOKENS, f"max_tokens is {max_tokens}; this server generates at most {MOST_TOKENS}")
    temperature = number(body, "temperature", 1.0, low=0.0, high=2.0)
    top_p = number(body, "top_p", 1.0, low=0.0, high=1.0)
    check(top_p > 0, "top_p must be above 0")
    seed = optional_int(body, "seed")
    check(seed is None or 0 <= seed < 2**63, f"seed must be in [0, 2**63), got {seed}")
    stream = body.get("stream") or False
    check(isinstance(stream, bool), "stream must be true or false")
    stream_options = body.get("stream_options") or {}
    check(isinstance(stream_options, dict) and set(stream_options) <= {"include_usage"},
          "stream_options takes only include_usage")
    greedy = temperature == 0.0
    options = TextOptions(optional_str(body, "method") or default_method, params_of(method_params(body)),
                          temperature, 1.0 if greedy else top_p, 0 if greedy or seed is None else seed,
                          None if greedy or seed is None else next(_ALONE))
    return TextRequest(kind, body["model"], prompt, n, max_tokens, stream,
                       bool(stream_options.get("include_usage")), options)


def check_options(pipeline, options: TextOptions) -> None:
    """Fail now, in one line, on an unknown method or parameter, or one that needs what the model lacks (before
    the request can fail a shared call)."""
    from mmaccel.core.methods import build_method

    build_method(options.method, **dict(options.params)).check_needs(pipeline.resources)


def prompt_ids(pipeline, request: TextRequest) -> list[int]:
    """The request's prompt as token ids: a completion's text as it is, a chat in the model's chat template."""
    if request.kind == "chat":
        return pipeline.encode_messages(request.prompt)
    ids = pipeline.tokenizer(request.prompt)["input_ids"]
    check(len(ids) > 0, "prompt is empty")
    return ids


def _choice(tokens: list[int], max_tokens: int, eos: int | None, tokenizer) -> Choice:
    tokens = tokens[:max_tokens]
    ended = eos is not None and eos in tokens
    if ended:
        tokens = tokens[:tokens.index(eos) + 1]
    return Choice(tokens, tokenizer.decode(tokens, skip_special_tokens=True), "stop" if ended else "length")


def _passes(commits: list[int]) -> int:
    """Target passes that committed a row's tokens (tokens of one pass came from accepted drafts)."""
    return len(set(commits))


def text_worker(name: str, pipeline, *, max_rows: int, max_queue: int, on_call, continuous: bool = True) -> ModelWorker:
    """The worker that decodes one text model's requests: continuous batching where the method can (and
    `continuous`), else a call per batch of requests with equal options."""
    eos = pipeline.tokenizer.eos_token_id

    def generate(options: TextOptions, rows: list[list[int]], max_new: int, tell=None, feed=None):
        return pipeline.generate_ids(rows, options.method, max_new_tokens=max_new, temperature=options.temperature,
                                     top_p=options.top_p, seed=options.seed, on_tokens=tell, feed=feed,
                                     **dict(options.params))

    def run(options: TextOptions, jobs: list[TextJob]) -> list[TextResult]:
        rows = [job.ids for job in jobs for _ in range(job.n)]
        starts = list(itertools.accumulate((job.n for job in jobs), initial=0))

        def tell(tokens: Sequence[list[int]]) -> None:
            for job, start in zip(jobs, starts):
                if job.stream is not None:
                    job.stream.push([row[:job.max_tokens] for row in tokens[start:start + job.n]])

        streamed = any(job.stream is not None for job in jobs)
        out = generate(options, rows, max(job.max_tokens for job in jobs), tell if streamed else None)
        commits = out.commit_pass or [[i for i, _ in enumerate(t)] for t in out.tokens]
        return [TextResult([_choice(t, job.max_tokens, eos, pipeline.tokenizer)
                            for t in out.tokens[start:start + job.n]], len(job.ids),
                           sum(_passes(c) for c in commits[start:start + job.n]))
                for job, start in zip(jobs, starts)]

    def joins(options: TextOptions) -> bool:
        from mmaccel.core.methods import build_method

        return options.temperature == 0.0 and build_method(options.method, **dict(options.params)).joins(
            pipeline.resources)

    def run_joining(options: TextOptions, joining: Joining) -> None:
        JoinedCall(pipeline, eos, joining, max_rows).run(lambda *a, **k: generate(options, *a, **k))

    return ModelWorker(name, run, max_rows=max_rows, max_queue=max_queue, on_call=on_call,
                       joins=joins if continuous else None, run_joining=run_joining)


class JoinedCall(JoinedRows):
    """One continuous-batching call: a row per choice of its jobs, each job answered when its rows end (spare rows
    and the joining rule of `mmaccel.serve.batching.JoinedRows`)."""

    def __init__(self, pipeline, eos: int | None, joining: Joining, max_rows: int):
        self.pipeline, self.eos = pipeline, eos
        self.choices: dict[int, list[Choice | None]] = {}        # id(job) -> its choices so far
        self.passes: dict[int, int] = {}
        super().__init__(joining, max_rows)
        spare = self.width - len(self.first)
        self.rows = [job.payload.ids for job, _ in self.first] + [[eos if eos is not None else 0]] * spare
        self.limits = [job.payload.max_tokens for job, _ in self.first] + [1] * spare
        self.max_new = max(job.payload.max_tokens for job in joining.jobs)
        self.reserve = JOIN_PROMPT_TOKENS

    def units(self, job: Job) -> int:
        return job.payload.n

    def fits(self, payload: TextJob, max_prompt: int) -> bool:
        """A waiting job joins when its prompt is at most `max_prompt` tokens and its `max_tokens` within the call's."""
        return len(payload.ids) <= max_prompt and payload.max_tokens <= self.max_new

    def opened(self, job: Job) -> None:
        self.choices[id(job)] = [None] * job.payload.n
        self.passes[id(job)] = 0

    def closed(self, job: Job) -> None:
        del self.choices[id(job)], self.passes[id(job)]

    def joiner(self, job: Job, unit: int) -> tuple[list[int], int]:
        return job.payload.ids, job.payload.max_tokens

    def run(self, generate) -> None:
        """Decode the call to its end with `generate(rows, max_new, tell, feed)`, this object as the `RowFeed`."""
        # a joining request may stream: every step is heard (the tokens are read back only while one does)
        generate(self.rows, self.max_new, self.tell, self)

    # ---- RowFeed (next and dropped: JoinedRows) ------------------------------------------------

    def finished(self, row: int, tokens: list[int], passes: list[int]) -> None:
        """`RowFeed.finished`: row `row`'s tokens become its job's choice; the job is answered once all are in."""
        if row not in self.table:                   # a spare row (opened empty)
            return
        job, i = self.table.pop(row)
        choices = self.choices[id(job)]
        choices[i] = _choice(tokens, job.payload.max_tokens, self.eos, self.pipeline.tokenizer)
        self.passes[id(job)] += _passes(passes)
        if all(c is not None for c in choices):
            del self.choices[id(job)]
            self.joining.finish(job, TextResult(choices, len(job.payload.ids), self.passes.pop(id(job))))

    # ---- streaming ------------------------------------------------------------------------------

    def tell(self, tokens: Sequence[list[int]]) -> None:
        """Each streamed job's rows' tokens so far (a row that ended: its choice's; one not placed yet: none)."""
        streamed: dict[int, tuple[Job, dict[int, list[int]]]] = {}
        for row, (job, i) in self.table.items():
            if job.payload.stream is not None:
                streamed.setdefault(id(job), (job, {}))[1][i] = tokens[row]
        for job, seen in streamed.values():
            done = self.choices[id(job)]
            job.payload.stream.push([seen.get(j, done[j].tokens if done[j] is not None else [])
                                     for j in range(job.payload.n)])


def passes_per_token(results: list[TextResult]) -> float | None:
    """Target passes per generated token of requests' completions (1 for plain decoding)."""
    tokens = sum(len(c.tokens) for r in results for c in r.choices)
    return round(sum(r.passes for r in results) / tokens, 4) if tokens else None


def _usage(request: TextRequest, result: TextResult) -> dict:
    completion = sum(len(c.tokens) for c in result.choices)
    return {"prompt_tokens": result.prompt_tokens, "completion_tokens": completion,
            "total_tokens": result.prompt_tokens + completion}


def _ours(request: TextRequest, result: TextResult) -> dict:
    return {"method": request.options.method, "params": dict(request.options.params),
            "target_passes_per_token": passes_per_token([result])}


def render(request: TextRequest, result: TextResult, model: str) -> dict:
    """OpenAI's completion (text_completion) or chat completion response."""
    head = _head(request, model)
    if request.kind == "completion":
        choices = [{"index": i, "text": c.text, "finish_reason": c.finish_reason, "logprobs": None}
                   for i, c in enumerate(result.choices)]
    else:
        choices = [{"index": i, "message": {"role": "assistant", "content": c.text}, "finish_reason": c.finish_reason,
                    "logprobs": None} for i, c in enumerate(result.choices)]
    return head | {"choices": choices, "usage": _usage(request, result), "mmaccel": _ours(request, result)}


def _head(request: TextRequest, model: str, chunk: bool = False) -> dict:
    if request.kind == "completion":
        return {"id": f"cmpl-{uuid.uuid4().hex[:24]}", "object": "text_completion", "created": int(time.time()),
                "model": model}
    return {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion.chunk" if chunk else "chat.completion",
            "created": int(time.time()), "model": model}


class _Deltas:
    """The text each row has sent so far; a row's next piece is its new text, held back while it ends inside a
    character (a byte-level token can split one)."""

    def __init__(self, rows: int, tokenizer):
        self.sent = [""] * rows
        self.tokenizer = tokenizer

    def piece(self, row: int, text: str) -> str:
        if text.endswith("\ufffd") or not text.startswith(self.sent[row]) or len(text) == len(self.sent[row]):
            return ""
        piece, self.sent[row] = text[len(self.sent[row]):], text
        return piece

    def of_tokens(self, row: int, tokens: list[int]) -> str:
        return self.piece(row, self.tokenizer.decode(tokens, skip_special_tokens=True))


def _event(payload: dict | str) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"


async def stream_events(request: TextRequest, model: str, future: concurrent.futures.Future, worker: ModelWorker,
                        stream: TokenStream, tokenizer) -> AsyncIterator[str]:
    """The server-sent events of a streamed request: a chunk per row each step that added text, a last chunk per
    row with its finish reason, the usage where asked, then `[DONE]`. A call that fails sends an error event; a
    client that goes away mid-stream gives its rows up (`ModelWorker.abandon`)."""
    try:
        async for event in _events(request, model, future, stream, tokenizer):
            yield event
    finally:
        if not future.done():
            worker.abandon(future)


async def _events(request: TextRequest, model: str, future: concurrent.futures.Future, stream: TokenStream,
                  tokenizer) -> AsyncIterator[str]:
    head = _head(request, model, chunk=True)
    chat = request.kind == "chat"

    def chunk(row: int, text: str | None, finish: str | None, first: bool = False) -> dict:
        if chat:
            delta = ({"role": "assistant", "content": ""} if first else {}) | ({} if text is None else {"content": text})
            return head | {"choices": [{"index": row, "delta": delta, "finish_reason": finish, "logprobs": None}]}
        return head | {"choices": [{"index": row, "text": text or "", "finish_reason": finish, "logprobs": None}]}

    deltas = _Deltas(request.n, tokenizer)
    if chat:
        for row in range(request.n):
            yield _event(chunk(row, None, None, first=True))
    waiting = asyncio.wrap_future(future)
    while True:
        getter = asyncio.ensure_future(stream.queue.get())
        done, _ = await asyncio.wait({getter, waiting}, return_when=asyncio.FIRST_COMPLETED)
        if getter not in done:
            getter.cancel()
            break
        for row, tokens in enumerate(getter.result()):
            if piece := deltas.of_tokens(row, tokens):
                yield _event(chunk(row, piece, None))
    try:
        result: TextResult = waiting.result()
    except Exception as err:          # the call failed after the stream began: the status is sent already
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        yield _event({"error": {"message": first, "type": "server_error", "param": None, "code": 500}})
        yield _event("[DONE]")
        return
    for row, choice in enumerate(result.choices):
        piece = deltas.piece(row, choice.text)
        yield _event(chunk(row, piece or None if chat else piece, choice.finish_reason))
    if request.usage_in_stream:
        yield _event(head | {"choices": [], "usage": _usage(request, result), "mmaccel": _ours(request, result)})
    yield _event("[DONE]")
