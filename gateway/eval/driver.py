"""One rerank request per (query, model), sent one at a time and timed.

The models are interleaved query by query, their order rotating (query 0: a b c, query 1: b c a,
...), so a machine that slows down during the run (other load, thermals) costs every model alike
and the latencies stay comparable. Sequential on purpose: the latency of a request is then the
model's own, not a queue's. Bodies are encoded before the clock starts; one keep-alive client
(``gateway.bench.driver.make_client``).

Any answer but a 200 with one result per document stops the run with :class:`EvalError`: a
metric over the queries that did answer would silently describe another data set.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import httpx
import msgspec

from gateway.bench.driver import make_client

__all__ = ("Answer", "EvalError", "Query", "run_models")


class EvalError(Exception):
    """The run cannot go on; the message is one line (the command prints it and exits 1)."""


@dataclass(frozen=True)
class Query:
    qid: str
    text: str
    doc_ids: list[str]  # the first stage's candidates, best first
    texts: list[str]


@dataclass(frozen=True)
class Answer:
    qid: str
    model: str
    order: list[str]  # document ids as the model ranked them
    scores: dict[str, float]  # document id -> relevance_score
    latency_s: float
    documents: int
    tokens: int | None  # meta.tokens.input_tokens (every stage of a cascade)


class _Result(msgspec.Struct):
    index: int
    relevance_score: float


class _Tokens(msgspec.Struct):
    input_tokens: int | None = None


class _Meta(msgspec.Struct):
    tokens: _Tokens | None = None


class _Reply(msgspec.Struct):
    results: list[_Result]
    meta: _Meta | None = None


class _Error(msgspec.Struct):
    message: str = ""


_reply = msgspec.json.Decoder(_Reply).decode
_error = msgspec.json.Decoder(_Error).decode
_encode = msgspec.json.Encoder().encode


def _why(resp: httpx.Response) -> str:
    try:
        message = _error(resp.content).message
    except msgspec.DecodeError:
        message = resp.text
    return " ".join(message.split())[:300] or resp.reason_phrase


async def _one(client: httpx.AsyncClient, url: str, headers: dict[str, str], model: str, q: Query) -> Answer:
    body = _encode({"model": model, "query": q.text, "documents": q.texts})
    started = time.perf_counter()
    try:
        resp = await client.post(url, content=body, headers=headers)
    except httpx.HTTPError as exc:
        raise EvalError(f"cannot reach {url}: {type(exc).__name__}: {exc}".rstrip(": ")) from None
    latency = time.perf_counter() - started
    if resp.status_code != 200:
        raise EvalError(f"model {model!r}, query {q.qid!r}: HTTP {resp.status_code}: {_why(resp)}")
    try:
        reply = _reply(resp.content)
    except msgspec.DecodeError as exc:
        raise EvalError(f"model {model!r}, query {q.qid!r}: not a rerank answer ({exc})") from None
    indices = [r.index for r in reply.results]
    if sorted(indices) != list(range(len(q.texts))):
        raise EvalError(
            f"model {model!r}, query {q.qid!r}: {len(indices)} results for {len(q.texts)} documents "
            "(each document once expected)"
        )
    tokens = reply.meta.tokens.input_tokens if reply.meta and reply.meta.tokens else None
    return Answer(
        qid=q.qid,
        model=model,
        order=[q.doc_ids[i] for i in indices],
        scores={q.doc_ids[r.index]: r.relevance_score for r in reply.results},
        latency_s=latency,
        documents=len(q.texts),
        tokens=tokens,
    )


async def run_models(
    url: str,
    headers: dict[str, str],
    models: Sequence[str],
    queries: Sequence[Query],
    *,
    timeout: float,
    warmup: int = 1,
    progress: Callable[[Answer], object] | None = None,
) -> dict[str, list[Answer]]:
    """Every query to every model, interleaved (see the module doc); ``warmup`` queries are sent
    to each model first, unmeasured (they also find a refusal -- a key not allowed the model, a
    model not served -- before the measured run starts)."""
    out: dict[str, list[Answer]] = {m: [] for m in models}
    async with make_client(1, timeout) as client:
        for q in queries[:warmup]:
            for model in models:
                await _one(client, url, headers, model, q)
        for i, q in enumerate(queries):
            for k in range(len(models)):
                model = models[(i + k) % len(models)]
                answer = await _one(client, url, headers, model, q)
                out[model].append(answer)
                if progress is not None:
                    progress(answer)
    return out
