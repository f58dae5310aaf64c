"""A rerank API over HTTP with a bearer key, as an engine: what DashScope and the hosted providers share.

One pooled httpx client from ``start`` to ``stop``, its headers (the key among them) set once at
start; no health probe; a request planned into calls within the API's limits and merged back
(:mod:`adapters.upstreams.split`), each call one bounded POST (:func:`post_bounded`) retried
inside the request's ``timeout_s``. A subclass says what differs: its headers (and where its key
comes from), the body, how a 200 is read and what any other status means.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Generic, TypeVar

import httpx

from adapters.base import EngineError, EngineUnavailableError, ScoreJob, ScoreResult
from adapters.upstreams.http import make_client, post_bounded
from adapters.upstreams.split import score_texts
from schemas.config import DashScopeEngineConfig, HostedRerankConfig

__all__ = ("RerankApiEngine",)


# The settings the shared part reads are those both kinds have.
C = TypeVar("C", bound="DashScopeEngineConfig | HostedRerankConfig")


class RerankApiEngine(abc.ABC, Generic[C]):
    """:class:`adapters.base.RerankEngine` calling one rerank API over HTTP, in split calls."""

    tokenizer = None

    def __init__(self, config: C, *, name: str, upstream: str, path: str) -> None:
        self._config = config
        self._client: httpx.AsyncClient | None = None
        self._name = name  # the API, for "the ... client is not started"
        self._upstream = upstream  # the API and the model, in messages
        self._path = path  # the rerank call's path under base_url

    async def start(self) -> None:
        cfg = self._config
        headers = self._headers()
        self._client = make_client(
            base_url=cfg.base_url.rstrip("/"),
            headers=headers,
            connect_timeout_s=cfg.connect_timeout_s,
            read_timeout_s=cfg.read_timeout_s,
            max_connections=cfg.max_connections,
        )

    async def stop(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def check_health(self) -> None:
        # Probing a hosted API on every /ready poll would cost quota (and most have no health route):
        # its failures surface per request, as the classes a fallback chain moves on from (502/503).
        if self._client is None:
            raise EngineUnavailableError(f"the {self._name} client is not started")

    async def score(self, job: ScoreJob) -> ScoreResult:
        client = self._client
        if client is None:
            raise EngineUnavailableError(f"the {self._name} client is not started")
        return await score_texts(
            job,
            lambda texts: self._call(client, job, texts),
            self._config,
            item_cap=self._item_cap(job),
            max_request_tokens=self._config.max_tokens_per_request,
        )

    def _item_cap(self, job: ScoreJob) -> int:
        """The most tokens one item (or the query) counts in the split plan.

        By default the API's per-item limit only: an API with no per-request truncation field
        (DashScope: ``max_tokens_per_doc`` is not sent) counts each item in full up to that limit.
        """
        return self._config.max_tokens_per_item

    async def _call(
        self, client: httpx.AsyncClient, job: ScoreJob, texts: Sequence[str]
    ) -> tuple[list[float], int | None]:
        response, content = await post_bounded(
            client,
            self._path,
            self._body(job, texts),
            upstream=self._upstream,
            read_timeout_s=self._config.read_timeout_s,
        )
        if response.status_code != 200:
            raise self._status_error(response, content)
        return self._parse(content, len(texts))

    @abc.abstractmethod
    def _headers(self) -> dict[str, str]:
        """The client's headers, the key's among them; raises :class:`EngineConfigError` without a key."""

    @abc.abstractmethod
    def _body(self, job: ScoreJob, texts: Sequence[str]) -> bytes:
        """One call's JSON body, asking for every score of ``texts`` and no documents back."""

    @abc.abstractmethod
    def _parse(self, content: bytes, size: int) -> tuple[list[float], int | None]:
        """A 200's scores in order and the tokens the API counted (None: unsaid); a malformed one raises."""

    @abc.abstractmethod
    def _status_error(self, response: httpx.Response, content: bytes) -> EngineError:
        """The error for any other status (logged here, with what only operators may see)."""
