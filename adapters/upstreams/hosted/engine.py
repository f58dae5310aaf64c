"""A hosted rerank API (Cohere, Jina AI, Voyage AI, Mixedbread, NVIDIA, Together) as an engine.

The gateway asks for every score and no documents, and orders, cuts and echoes itself, so a hosted
model answers exactly like a local one. A request over the provider's limits (documents per call,
tokens per call) is split into calls and merged in order (:class:`adapters.upstreams.api.RerankApiEngine`,
which DashScope's engine extends too); each call is retried only on the answers the provider's docs
say to retry, never sooner than its ``Retry-After``, and never past the request's ``timeout_s``.

The failures keep the classes every upstream raises (:mod:`adapters.base`), so a fallback chain can
tell them apart: the request's own fault (:class:`EngineInputError`, 422) goes back as it is; a
rate limit or an outage (:class:`RetryableUpstreamError`, 503), a timeout (504), a refused key or
account (:class:`EngineAccountError`) or a missing model (:class:`EngineMisconfiguredError`) are
the target's.

The key is read once at start (``api_key``, ``api_key_file``, ``api_key_env``), sent only as the
``Authorization`` header, and cut out of any upstream text before it is logged or shown.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import httpx
import msgspec
import structlog

from adapters.base import (
    EngineAccountError,
    EngineConfigError,
    EngineError,
    EngineInputError,
    EngineMisconfiguredError,
    ScoreJob,
    ScoreResult,
)
from adapters.upstreams.api import RerankApiEngine
from adapters.upstreams.hosted.providers import PROVIDERS, Outcome
from adapters.upstreams.http import (
    RetryableUpstreamError,
    parse_retry_after,
    read_api_key,
    upstream_message,
)
from adapters.upstreams.split import place_scores
from schemas.config import CohereEngineConfig, HostedRerankConfig, NvidiaEngineConfig
from schemas.config.hosted import NVIDIA_CATALOG_URL

__all__ = ("HostedEngine",)

log = structlog.get_logger("adapters.upstreams.hosted")
_encoder = msgspec.json.Encoder()


class HostedEngine(RerankApiEngine[HostedRerankConfig]):
    """:class:`adapters.base.RerankEngine` calling one hosted provider's rerank API."""

    def __init__(self, config: HostedRerankConfig) -> None:
        self._provider = PROVIDERS[type(config)]
        super().__init__(
            config,
            name=self._provider.name,
            upstream=f"{self._provider.name} (model {config.model})",
            path=config.path,
        )
        self._key: str | None = None
        # NVIDIA answers logits: the raw score is the logit itself, the score its sigmoid.
        self.supports_raw_scores = self._provider.logits

    def _headers(self) -> dict[str, str]:
        cfg = self._config
        key = read_api_key(cfg.api_key, cfg.api_key_file, cfg.api_key_env)
        # A self-hosted NIM runs without keys; the NVIDIA catalog and every other provider need one.
        optional = isinstance(cfg, NvidiaEngineConfig) and cfg.base_url.rstrip("/") != NVIDIA_CATALOG_URL
        if key is None and not optional:
            env = f"the environment variable {cfg.api_key_env}" if cfg.api_key_env else "api_key_env"
            raise EngineConfigError(f"no {self._provider.name} API key: set api_key, api_key_file or {env}")
        self._key = key
        headers = {"Accept": "application/json"}
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        return headers

    async def score(self, job: ScoreJob) -> ScoreResult:
        result = await super().score(job)
        if self._provider.logits and not job.raw_scores:
            return ScoreResult(scores=[_sigmoid(x) for x in result.scores], input_tokens=result.input_tokens)
        return result

    def _item_cap(self, job: ScoreJob) -> int:
        cfg = self._config
        cap = cfg.max_tokens_per_item
        if isinstance(cfg, CohereEngineConfig):  # Cohere truncates each document to what is sent
            cap = min(cap, cfg.max_tokens_per_doc, job.max_tokens_per_doc or cap)
        return cap

    def _body(self, job: ScoreJob, texts: Sequence[str]) -> bytes:
        return _encoder.encode(self._provider.body(self._config, job, texts))

    def _parse(self, content: bytes, size: int) -> tuple[list[float], int | None]:
        try:
            results, tokens = self._provider.parse(content)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.error(
                "hosted_malformed_response",
                model=self._config.name,
                provider=self._provider.name,
                error=self._redact(str(exc))[:300],
            )
            raise EngineError(f"{self._upstream} returned a malformed response") from None
        return place_scores(results, size, self._upstream), tokens

    def _redact(self, text: str) -> str:
        # Some APIs quote the key they refused; the key never reaches a log line or a client.
        return text.replace(self._key, "***") if self._key else text

    def _status_error(self, response: httpx.Response, content: bytes) -> EngineError:
        cfg, name, status = self._config, self._provider.name, response.status_code
        message, code = upstream_message(content, f"HTTP {status}")
        message = self._redact(message)
        outcome = self._provider.outcome(status)
        fields = {"model": cfg.name, "provider": name, "status": status, "code": code, "message": message}
        if outcome is Outcome.INPUT:
            log.info("hosted_rejected_input", **fields)
            return EngineInputError(f"{name} rejected the request ({code or status}): {message}")
        if outcome is Outcome.ACCOUNT:
            # The gateway's key or account: the client sees a generic 502, operators see this line.
            log.error("hosted_account_refused", **fields)
            return EngineAccountError(f"{self._upstream} refused the gateway's key or account (HTTP {status})")
        if outcome is Outcome.MISCONFIGURED:
            log.error("hosted_upstream_misconfigured", **fields, path=cfg.path)
            return EngineMisconfiguredError(
                f"model '{cfg.name}' is misconfigured: {name} has no model '{cfg.model}' or no route at its `path` "
                "(HTTP 404); the gateway's operator must fix `model`, `base_url` or `path` (retrying will not help)"
            )
        if outcome is Outcome.RETRY:
            log.warning("hosted_retryable_error", **fields)
            wait = parse_retry_after(response.headers.get("retry-after"))
            return RetryableUpstreamError(
                f"{name} is unavailable or rate limited (HTTP {status}); retry later", wait_hint=wait
            )
        log.error("hosted_unexpected_status", **fields)
        return EngineError(f"{self._upstream} answered HTTP {status}: {message}")


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))
