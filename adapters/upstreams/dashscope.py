"""Alibaba DashScope text rerank as an engine: the native and the compatible endpoint.

The gateway asks for every score (``top_n`` = all, no documents echoed) and orders, cuts and
echoes itself, so a DashScope model answers exactly like a local one. A request over the
model's limits (documents per call, tokens per request) is split into several upstream calls,
run a few at a time, and their results are put back at their global positions.

DashScope counts tokens with its own tokenizer, which the gateway does not have. The split is
planned on :func:`estimate_tokens`, an estimate meant to err high; items over the per-item
limit are truncated by DashScope (not rejected), so they count at most that limit.

Errors (their envelope is ``{code, message, request_id}``): 400/413 become the client's 422
with their message, except the 400s about the operator's account (``Arrearage``,
``UnsupportedOperation``: 502, details only in the log); 401/403 are the gateway's own
credentials (502, details only in the log);
429, 5xx and connect errors are retried (backoff with jitter, at least ``Retry-After``) and
then become 503; a read timeout is 504.
"""

from __future__ import annotations

from collections.abc import Sequence

import httpx
import msgspec
import structlog

from adapters.base import (
    EngineAccountError,
    EngineConfigError,
    EngineError,
    EngineInputError,
    ScoreJob,
)
from adapters.upstreams.api import RerankApiEngine
from adapters.upstreams.http import (
    RetryableUpstreamError,
    parse_retry_after,
    resolve_api_key,
    upstream_message,
)
from adapters.upstreams.split import estimate_tokens, place_scores, plan_calls
from schemas.config import DashScopeEngineConfig

__all__ = ("COMPATIBLE_PATH", "NATIVE_PATH", "DashScopeEngine", "estimate_tokens", "plan_calls")

NATIVE_PATH = "/api/v1/services/rerank/text-rerank/text-rerank"
# Plural "reranks" under compatible-api; /compatible-mode/v1/reranks does not exist.
COMPATIBLE_PATH = "/compatible-api/v1/reranks"

log = structlog.get_logger("adapters.upstreams.dashscope")

# DashScope answers these with HTTP 400, but they are about the gateway's DashScope account or
# the configured model, not the client's request: 502 like a refused key, not the client's 422.
_ACCOUNT_CODES = {
    "Arrearage": "the account has an overdue payment",
    "UnsupportedOperation": "the configured model does not support this operation",
}
_encoder = msgspec.json.Encoder()


class _Result(msgspec.Struct):
    index: int
    relevance_score: float


class _Usage(msgspec.Struct):
    # The docs and SDK disagree on the key: read all three.
    total_tokens: int | None = None
    input_tokens: int | None = None
    prompt_tokens: int | None = None

    def tokens(self) -> int | None:
        for value in (self.total_tokens, self.input_tokens, self.prompt_tokens):
            if value is not None and value >= 0:  # a negative count is no count
                return value
        return None


class _NativeOutput(msgspec.Struct):
    results: list[_Result]


class _NativeResponse(msgspec.Struct):
    output: _NativeOutput
    usage: _Usage | None = None


class _CompatibleResponse(msgspec.Struct):
    results: list[_Result]
    usage: _Usage | None = None


_native_decoder = msgspec.json.Decoder(_NativeResponse)
_compatible_decoder = msgspec.json.Decoder(_CompatibleResponse)


class DashScopeEngine(RerankApiEngine[DashScopeEngineConfig]):
    """:class:`adapters.base.RerankEngine` calling DashScope's text rerank API."""

    def __init__(self, config: DashScopeEngineConfig) -> None:
        super().__init__(
            config,
            name="DashScope",
            upstream=f"DashScope ({config.endpoint} endpoint, model {config.model})",
            path=NATIVE_PATH if config.endpoint == "native" else COMPATIBLE_PATH,
        )

    def _headers(self) -> dict[str, str]:
        cfg = self._config
        key = resolve_api_key(cfg.api_key, cfg.api_key_env)
        if key is None:
            where = f"the environment variable {cfg.api_key_env}" if cfg.api_key_env else "api_key_env"
            raise EngineConfigError(f"no DashScope API key: set api_key or {where}")
        headers = {"Authorization": f"Bearer {key}", "Accept": "application/json"}
        if cfg.workspace:
            headers["X-DashScope-WorkSpace"] = cfg.workspace
        return headers

    def _body(self, job: ScoreJob, texts: Sequence[str]) -> bytes:
        cfg = self._config
        # Ask for all scores and no documents: ordering, top_n and echo are the gateway's job.
        if cfg.endpoint == "native":
            parameters: dict[str, object] = {"top_n": len(texts), "return_documents": False}
            if job.instruction:
                parameters["instruct"] = job.instruction
            body: dict[str, object] = {
                "model": cfg.model,
                "input": {"query": job.query, "documents": list(texts)},
                "parameters": parameters,
            }
        else:
            body = {"model": cfg.model, "query": job.query, "documents": list(texts), "top_n": len(texts)}
            if job.instruction:
                body["instruct"] = job.instruction
        return _encoder.encode(body)

    def _parse(self, body: bytes, size: int) -> tuple[list[float], int | None]:
        try:
            if self._config.endpoint == "native":
                native = _native_decoder.decode(body)
                results, usage = native.output.results, native.usage
            else:
                compatible = _compatible_decoder.decode(body)
                results, usage = compatible.results, compatible.usage
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.error("dashscope_malformed_response", model=self._config.name, error=str(exc)[:300])
            raise EngineError(f"{self._upstream} returned a malformed response: {exc}") from None
        scores = place_scores(((r.index, r.relevance_score) for r in results), size, self._upstream)
        return scores, usage.tokens() if usage is not None else None

    def _status_error(self, response: httpx.Response, content: bytes) -> EngineError:
        status = response.status_code
        message, code = upstream_message(content, f"HTTP {status}")
        request_id = _request_id(content)
        fields = {"model": self._config.name, "status": status, "code": code, "request_id": request_id}
        if code in _ACCOUNT_CODES:
            # 400s about the operator's account or model, not the request: nothing the client can change.
            log.error("dashscope_account_refused", **fields, message=message)
            return EngineAccountError(
                f"{self._upstream} refused the gateway's account ({code}: {_ACCOUNT_CODES[code]})"
            )
        if status in (400, 413):
            log.info("dashscope_rejected_input", **fields, message=message)
            return EngineInputError(f"DashScope rejected the request ({code or status}): {message}")
        if status in (401, 403):
            # Our key, not the client's: the client sees a generic 502, operators see this line.
            log.error("dashscope_auth_failed", **fields, message=message)
            return EngineAccountError(f"{self._upstream} refused the gateway's credentials ({code or status})")
        if status in (408, 429) or status >= 500:
            log.warning("dashscope_retryable_error", **fields, message=message)
            wait = parse_retry_after(response.headers.get("retry-after"))
            reason = f"HTTP {status} {code}" if code else f"HTTP {status}"
            return RetryableUpstreamError(
                f"DashScope is unavailable or rate limited ({reason}); retry later", wait_hint=wait
            )
        log.error("dashscope_unexpected_status", **fields, message=message)
        return EngineError(f"{self._upstream} answered HTTP {status} ({code}): {message}")


class _RequestId(msgspec.Struct):
    request_id: str | None = None


def _request_id(body: bytes) -> str | None:
    try:
        return msgspec.json.decode(body, type=_RequestId).request_id
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
