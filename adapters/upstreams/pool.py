"""A model served by several upstream replicas (vLLM, TEI, Infinity, Cohere-compatible).

Whole requests are forwarded (never one call per document): the upstream batches far better
than we could. Only a protocol's own limit splits a request (TEI: 32 texts per call).

Replica choice:
- affinity: rendezvous hashing of (instruction, query) ranks the healthy replicas, so one
  query's requests land on the replica holding its prompt prefix in cache, and losing a
  replica moves only the queries that lived there;
- least outstanding requests decides when affinity is off, and overrides affinity when the
  preferred replica has more than ``affinity_slack`` requests beyond the least busy one.

Passive health: connect errors, dropped connections, timeouts and 502/503/504 count as
failures; ``eject_after_failures`` consecutive ones eject the replica for ``cooldown_s``; after
that its ``health_path`` is probed, and only a passing probe readmits it. A replica ejected
again before it has answered a call since stays out twice as long each time, up to
``max_cooldown_s`` (Envoy's outlier detection: :func:`cooldown_for`). A call that could
not reach a replica (or got 503/429) is sent to another replica, each tried at most once.
A replica misconfigured by the operator (it serves a model that is not a reranker, or not the
configured ``model``, or speaks another protocol: :mod:`adapters.upstreams.refusals`) is treated
the same way when the pool has another replica: its refusal counts as a failure and the call
goes to the next replica, so a half-migrated pool keeps answering and the replica leaves rotation.
The client gets the misconfiguration's 502 only when no replica could answer and one refused so.
At most ``max_ejected_share`` of the replicas are ejected at once (Envoy's
``max_ejection_percent``): when the whole pool is slow or failing, ejecting every replica would
turn the slowdown into 503s for ``cooldown_s``, so the rest stay in rotation.

The hot path is lean on purpose (a passthrough gateway is CPU-bound on it): one aiohttp session
per model (O(1) keep-alive pool, C HTTP parser; see ``adapters.upstreams.http``), the body
encoded once by msgspec, and ``top_n`` forwarded when one call holds the whole job and the job
allows it (``ScoreJob.top_n``), so the upstream answers with 10 results instead of 100.

An answer that is final for the request (the operator's mistakes, the gateway's credentials
refused, the client's input refused) is read in :mod:`adapters.upstreams.refusals`.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import structlog

from adapters import tracing
from adapters.base import (
    EngineError,
    EngineMisconfiguredError,
    EngineTimeoutError,
    EngineUnavailableError,
    ScoreJob,
    ScoreResult,
)
from adapters.outliers import OutlierPolicy, Outliers
from adapters.upstreams.http import (
    RetryableUpstreamError,
    answer_limit,
    gather_or_cancel,
    make_session,
    map_aiohttp_error,
    parse_retry_after,
    resolve_api_key,
)
from adapters.upstreams.protocols import UpstreamAnswer, UpstreamCall, make_protocol
from adapters.upstreams.refusals import refusal_error
from adapters.upstreams.replicas import Replica, cooldown_for, rendezvous_order
from schemas.config import PoolEngineConfig

__all__ = ("PoolEngine", "Replica", "cooldown_for", "rendezvous_order")  # the last three: adapters.upstreams.replicas

log = structlog.get_logger("adapters.upstreams.pool")


class PoolEngine:
    """:class:`adapters.base.RerankEngine` over a list of upstream replicas."""

    tokenizer = None
    # Traffic probes ejected replicas (after cooldown_s) and readmits them: the service keeps
    # sending requests while /ready reports the pool unhealthy.
    heals_with_traffic = True

    def __init__(self, config: PoolEngineConfig, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._config = config
        # Cooldowns are measured on this clock (seconds; tests step it instead of sleeping).
        self._clock = clock
        model = config.model if config.model is not None or config.protocol != "cohere" else config.name
        self._protocol = make_protocol(config.protocol, model=model, forward_instruction=config.forward_instruction)
        self._replicas = [Replica(url) for url in config.urls]
        # Ejection and readmission: the same bookkeeping a fallback chain uses for its targets.
        self._outliers = Outliers(
            self._replicas,
            OutlierPolicy(
                eject_after_failures=config.eject_after_failures,
                cooldown_s=config.cooldown_s,
                max_cooldown_s=config.effective_max_cooldown_s,
                max_ejected_share=config.max_ejected_share,
            ),
            model=config.name,
            kind="replica",
            logger=log,
            clock=clock,
        )
        self._client: aiohttp.ClientSession | None = None
        # Probes get connections of their own: queued behind busy scoring calls on the shared
        # connector, a probe of a healthy (just busy) replica would time out and eject it.
        self._probe_client: aiohttp.ClientSession | None = None
        self._round_robin = itertools.count()

    def replica_stats(self) -> list[dict[str, Any]]:
        """Per-replica counters (for tests, debugging and status pages), with how long its next ejection would last."""
        return [{**r.stats(), "next_cooldown_s": self._cooldown(r.ejections + 1)} for r in self._replicas]

    def stats(self) -> dict[str, Any]:
        """Shown by ``/ready`` per model: :meth:`replica_stats`, and how long an ejected replica's cooldown has left.

        ``/ready`` needs no key, so the URLs are shown without credentials
        (:func:`adapters.upstreams.replicas.redact_url`).
        """
        now = self._clock()
        replicas = self.replica_stats()
        for stats, replica in zip(replicas, self._replicas, strict=True):
            # 0.0 once the cooldown is over: the next request (or /ready poll) probes it.
            until = replica.ejected_until
            stats["cooldown_left_s"] = None if until is None else round(max(0.0, until - now), 1)
        return {"replicas": replicas}

    def _cooldown(self, ejections: int) -> float:
        return self._outliers.cooldown(ejections)

    async def start(self) -> None:
        cfg = self._config
        key = resolve_api_key(cfg.api_key, cfg.api_key_env)
        headers = {"Accept": "application/json", "Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        # Replicas that are down now are not a start failure: passive health and probes
        # admit them when they come up, and /ready reports the pool meanwhile.
        self._client = make_session(
            headers=headers,
            connect_timeout_s=cfg.connect_timeout_s,
            read_timeout_s=cfg.read_timeout_s,
            max_connections=cfg.max_connections,
        )
        self._probe_client = make_session(
            headers=headers,
            connect_timeout_s=cfg.probe_timeout_s,
            read_timeout_s=cfg.probe_timeout_s,
            max_connections=2 * len(self._replicas),  # a /ready probe and a traffic-started one
        )

    async def stop(self) -> None:
        probes = [r.probe for r in self._replicas if r.probe is not None]
        for task in probes:
            task.cancel()
        await asyncio.gather(*probes, return_exceptions=True)
        if self._client is not None:
            await self._client.close()
            self._client = None
        if self._probe_client is not None:
            await self._probe_client.close()
            self._probe_client = None

    async def check_health(self) -> None:
        """Probe every replica now; unavailable when none passes."""
        # By the probes' verdict, not by who is admitted: the ejection cap may keep a replica
        # whose probe failed in rotation, and /ready must still say the model is down.
        passed = await asyncio.gather(*(self._probe(r) for r in self._replicas))
        if not any(passed):
            raise EngineUnavailableError(
                f"no replica of '{self._config.name}' passes its health probe", retry_after=self._retry_after()
            )

    async def score(self, job: ScoreJob) -> ScoreResult:
        if self._client is None:
            raise EngineUnavailableError("the pool's HTTP client is not started")
        texts = job.texts
        size = self._config.max_batch or self._protocol.default_max_batch or len(texts)
        key = f"{job.instruction}\x00{job.query}".encode() if self._config.affinity else None
        if len(texts) <= size:
            # One call holds the whole job: the upstream may rank and cut it (several calls
            # would each need all their scores for the merge).
            top_n = job.top_n if self._protocol.supports_top_n and job.top_n and job.top_n < len(texts) else None
            part = await self._forward(
                key, UpstreamCall(job.query, job.instruction, texts, job.max_tokens_per_doc, top_n)
            )
            return ScoreResult(scores=part.scores, input_tokens=part.tokens, indices=part.indices)
        texts = list(texts)
        calls = [
            UpstreamCall(job.query, job.instruction, texts[i : i + size], job.max_tokens_per_doc)
            for i in range(0, len(texts), size)
        ]
        parts = await gather_or_cancel(*(self._forward(key, call) for call in calls))
        scores = [s for part in parts for s in part.scores]
        return ScoreResult(scores=scores, input_tokens=sum(part.tokens for part in parts))

    # -- routing -------------------------------------------------------------------------------
    async def _forward(self, key: bytes | None, call: UpstreamCall) -> UpstreamAnswer:
        tried: set[str] = set()
        last: EngineError | None = None
        misconfigured: EngineMisconfiguredError | None = None
        body = self._protocol.encode(call)  # once, whichever replica takes it
        while True:
            replica = await self._choose(key, tried)
            if replica is None:
                # The operator's mistake is the cause to report, not the 503 of a replica that
                # is down as well (a 503 would have the client retry what will not change).
                if misconfigured is not None:
                    raise misconfigured
                # The client sees no replica URLs (internal topology); the log line has them.
                if last is not None:
                    log.warning("pool_exhausted", model=self._config.name, tried=len(tried), last_error=str(last))
                    raise EngineUnavailableError(
                        f"no replica of '{self._config.name}' could take the request ({len(tried)} tried)",
                        retry_after=max(last.retry_after, 1),
                    )
                raise EngineUnavailableError(
                    f"no healthy replica of '{self._config.name}'", retry_after=self._retry_after()
                )
            tried.add(replica.url)
            try:
                return await self._send(replica, call, body)
            except RetryableUpstreamError as exc:
                last = exc  # this replica could not take it: try the next one
            except EngineMisconfiguredError as exc:
                if len(self._replicas) == 1:
                    raise
                misconfigured = exc  # another replica may be set up right (a half-migrated pool)

    async def _choose(self, key: bytes | None, tried: set[str]) -> Replica | None:
        candidates = [r for r in self._replicas if r.url not in tried]
        admitted = await self._outliers.admitted_of(candidates, self._probe)
        if not admitted:
            return None
        if len(admitted) == 1:  # one replica up: no ordering to compute
            return admitted[0]
        least = min(r.outstanding for r in admitted)
        if key is not None:
            for replica in rendezvous_order(key, admitted):
                if replica.outstanding <= least + self._config.affinity_slack:
                    return replica
        idle = [r for r in admitted if r.outstanding == least]
        return idle[next(self._round_robin) % len(idle)]

    async def _send(self, replica: Replica, call: UpstreamCall, body: bytes) -> UpstreamAnswer:
        assert self._client is not None
        upstream = f"replica {replica.shown}"
        # Each replica tried is one client span; the replica gets this span as its traceparent.
        span = tracing.start(
            "upstream.call",
            {"rerank.model": self._config.name, "rerank.target": replica.shown, "http.request.body.size": len(body)},
        )
        replica.outstanding += 1
        try:
            async with self._client.post(
                replica.url + self._protocol.path, data=body, headers=tracing.headers(span)
            ) as response:
                content = await _read_bounded(response, answer_limit(len(body)))
                status, headers = response.status, response.headers
        except BaseException as exc:
            tracing.end(span, "cancelled" if isinstance(exc, asyncio.CancelledError) else type(exc).__name__)
            if not isinstance(exc, aiohttp.ClientError | TimeoutError):
                raise
            error = map_aiohttp_error(exc, upstream, read_timeout_s=self._config.read_timeout_s)
            if isinstance(error, RetryableUpstreamError | EngineTimeoutError):
                self._failed(replica, type(exc).__name__)
            raise error from None
        finally:
            replica.outstanding -= 1
        tracing.end(span, "ok" if status == 200 else str(status), **{"http.response.status_code": status})
        if status == 200:
            result = self._protocol.decode(content, headers, call, len(body))
            # An answer ends its run of ejections too: its next one is cooldown_s again. (A passing
            # /health does not: a replica serving another model passes it.)
            self._outliers.answered(replica)
            replica.served += 1
            return result
        if status in (502, 503, 504):
            self._failed(replica, f"HTTP {status}")
        if status in (429, 502, 503):
            wait = parse_retry_after(headers.get("retry-after"))
            raise RetryableUpstreamError(f"{upstream} is unavailable (HTTP {status})", wait_hint=wait)
        if status == 504:
            raise EngineTimeoutError(f"{upstream} timed out (HTTP 504: a limit of its own)")
        error = refusal_error(
            status,
            content,
            model=self._config.name,
            replica=replica.shown,
            upstream_model=self._protocol.model,
            protocol=self._config.protocol,
            path=self._protocol.path,
        )
        if isinstance(error, EngineMisconfiguredError) and len(self._replicas) > 1:
            # Its /health passes, but it cannot answer any request: out of rotation (under the
            # cap) like a failing replica, so its share of the traffic stops paying a retry.
            # Not in a pool of one: ejecting its only replica would only turn the 502 into 503s.
            self._failed(replica, f"misconfigured (HTTP {status})")
        raise error

    # -- health ----------------------------------------------------------------------------
    def _failed(self, replica: Replica, reason: str) -> None:
        self._outliers.failed(replica, reason)

    async def _probe(self, replica: Replica) -> bool:
        """Whether ``replica`` passes its health probe; ejects it, or readmits it once its cooldown is over."""
        assert self._probe_client is not None
        try:
            async with self._probe_client.get(
                replica.url + self._config.health_path,
                timeout=aiohttp.ClientTimeout(total=self._config.probe_timeout_s),
            ) as response:
                await response.read()
                ok, reason = response.status == 200, f"HTTP {response.status}"
        except (aiohttp.ClientError, TimeoutError) as exc:
            ok, reason = False, type(exc).__name__
        self._outliers.probed(replica, ok, reason)
        return ok

    def _retry_after(self) -> int:
        return self._outliers.retry_after()


async def _read_bounded(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """The body, or :class:`EngineError` (502) once it is past ``limit`` bytes (the connection is dropped)."""
    if response.content_length is not None and response.content_length > limit:
        response.close()
        raise EngineError(f"upstream answer of {response.content_length} bytes is over the limit of {limit}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_any():
        size += len(chunk)
        if size > limit:
            response.close()
            raise EngineError(f"upstream answer is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
