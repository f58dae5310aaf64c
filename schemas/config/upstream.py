"""``[[models]]`` entries scored over HTTP: DashScope, and pools of vLLM / TEI / Infinity /
Cohere-compatible replicas."""

from __future__ import annotations

from typing import Annotated, Literal
from urllib.parse import urlsplit, urlunsplit

import msgspec

from .base import ModelConfig, ModelName, Positive, PositiveFloat

# A pool's max_cooldown_s when unset (unless its cooldown_s is longer), as Envoy's max_ejection_time.
DEFAULT_MAX_COOLDOWN_S = 300.0


class UpstreamHttpConfig(ModelConfig, frozen=True):
    """Fields of engines that score over HTTP. ``timeout_s`` is the total per request, retries included."""

    connect_timeout_s: PositiveFloat = 5.0  # longest wait for a TCP + TLS connection to the upstream
    # Longest wait for the upstream's answer to one call.
    read_timeout_s: PositiveFloat = 30.0
    # The key sent as ``Authorization: Bearer``; or the name of an environment variable holding it.
    api_key: str | None = None
    api_key_env: str | None = None  # see api_key
    # Keep-alive connections per upstream host.
    max_connections: Positive = 64
    # Instruction used when the request has none; "" sends none (the upstream's default applies).
    instruction: str = ""


class DashScopeEngineConfig(UpstreamHttpConfig, tag="dashscope", kw_only=True, frozen=True):
    """Alibaba DashScope text rerank. Requests over the model's limits are split and merged."""

    # The upstream model name (gte-rerank-v2, qwen3-rerank, ...).
    model: ModelName
    # "native" = /api/v1/services/rerank/text-rerank/text-rerank; "compatible" = /compatible-api/v1/reranks.
    endpoint: Literal["native", "compatible"] = "native"
    # Region host (Beijing by default); e.g. https://dashscope-intl.aliyuncs.com for Singapore.
    base_url: str = "https://dashscope.aliyuncs.com"
    api_key_env: str | None = "DASHSCOPE_API_KEY"  # the environment variable holding the key (when api_key is unset)
    workspace: str | None = None  # DashScope workspace id, sent as X-DashScope-WorkSpace; None: the default
    # The model's limits (DashScope docs, they vary by model and region): one upstream call
    # never exceeds them; larger requests become several calls.
    max_documents_per_call: Positive = 500
    max_tokens_per_item: Positive = 4000  # see max_documents_per_call
    max_tokens_per_request: Positive = 30_000  # see max_documents_per_call
    max_parallel_calls: Positive = 4  # upstream calls of one split request in flight at once
    # Retries of one call after 429, 5xx or a connect error (exponential backoff, jitter, Retry-After).
    retries: Annotated[int, msgspec.Meta(ge=0, le=10)] = 3
    backoff_initial_s: PositiveFloat = 0.5  # first retry delay, doubled each time (with jitter) ...
    backoff_max_s: PositiveFloat = 10.0  # ... up to this


class PoolEngineConfig(UpstreamHttpConfig, tag="pool", kw_only=True, frozen=True):
    """A model served by replicas of vLLM, TEI, Infinity or a Cohere-compatible server."""

    # The replicas' API: vllm (/rerank), vllm-score (/score), tei, infinity, cohere (/v2/rerank).
    protocol: Literal["vllm", "vllm-score", "tei", "infinity", "cohere"]
    urls: Annotated[tuple[str, ...], msgspec.Meta(min_length=1)]  # base URLs of the replicas
    # The model name sent upstream (None: omitted; the cohere protocol sends `name`).
    model: str | None = None
    # Texts per upstream call; None: the whole request in one call (32 for tei, its default limit).
    max_batch: Positive | None = None
    # Route one (instruction, query) to the same replica so its prompt prefix stays cached...
    affinity: bool = True
    # ... unless that replica has more than this many requests in flight beyond the least busy one.
    affinity_slack: Annotated[int, msgspec.Meta(ge=0)] = 4
    # Send the instruction upstream (vllm/cohere protocols; tei and infinity have no such field).
    forward_instruction: bool = True
    # Passive health: eject a replica after this many consecutive failures, for cooldown_s,
    # then probe health_path before sending it traffic again.
    eject_after_failures: Positive = 3
    cooldown_s: PositiveFloat = 10.0  # how long an ejected replica gets no traffic
    # A replica ejected again before it has answered since its readmission stays out twice as
    # long each time (a replica serving another model passes its /health, so each cooldown ends
    # in its readmission and more refusals), up to this; None: 300 s, or cooldown_s if longer
    # (Envoy's max_ejection_time default).
    max_cooldown_s: PositiveFloat | None = None
    # Most of the pool ejected at once (Envoy's max_ejection_percent): when every replica is
    # slow or failing (overload), the rest stay in rotation instead of the pool answering 503
    # for cooldown_s. 0.5: a pool of 1 is never ejected, 1 of 2 or 3, 2 of 4; 1.0: no cap.
    max_ejected_share: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.5
    health_path: str = "/health"  # probed (GET, 200 expected) before an ejected replica is used again
    probe_timeout_s: PositiveFloat = 2.0  # time limit of that probe

    def __post_init__(self) -> None:
        for url in self.urls:
            _check_replica_url(url, api_key=self.api_key is not None or self.api_key_env is not None)
        if self.max_cooldown_s is not None and self.max_cooldown_s < self.cooldown_s:
            raise ValueError(
                f"max_cooldown_s ({self.max_cooldown_s}) is below cooldown_s ({self.cooldown_s}): it caps the "
                f"growing cooldowns of a replica ejected again and again, so it must be at least cooldown_s; "
                f"raise it, or drop it for the default ({DEFAULT_MAX_COOLDOWN_S:g} s, or cooldown_s if longer)"
            )

    @property
    def effective_max_cooldown_s(self) -> float:
        """``max_cooldown_s``, or its default when unset: 300 s, or ``cooldown_s`` if longer."""
        if self.max_cooldown_s is not None:
            return self.max_cooldown_s
        return max(DEFAULT_MAX_COOLDOWN_S, self.cooldown_s)


def _check_replica_url(url: str, *, api_key: bool) -> None:
    """Refuse, at load, a replica URL the pool cannot call: the pool appends its API's path
    (``/rerank``...) to the URL, so a query string or fragment would swallow the path, and
    aiohttp refuses credentials in a URL beside an ``Authorization`` header (every call and
    probe failed with ``ValueError``)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  # raises ValueError on a port out of range or not a number
    except ValueError as exc:
        raise ValueError(f"urls: {_shown(url)} is not a URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"urls: {_shown(url)} must be an http:// or https:// URL with a host")
    if parts.query or parts.fragment or url.rstrip("/").endswith(("?", "#")):
        raise ValueError(
            f"urls: {_shown(url)} has a query string or fragment; the pool appends the API's path "
            "to each URL: give the base URL only (a token goes in api_key or api_key_env)"
        )
    if api_key and (parts.username or parts.password):
        raise ValueError(
            f"urls: {_shown(url)} holds credentials and api_key / api_key_env is set: a call cannot send both; keep one"
        )


def _shown(url: str) -> str:
    """The URL for an error message, without credentials (config errors are logged and printed)."""
    try:
        parts = urlsplit(url)
        if "@" in parts.netloc:
            return repr(
                urlunsplit(parts._replace(netloc="***@" + parts.netloc.rsplit("@", 1)[1], query="", fragment=""))
            )
    except ValueError:
        return "(a URL that does not parse)"
    return repr(url) if "@" not in url else "(a URL that may hold credentials)"
