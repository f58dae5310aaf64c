"""AWS Bedrock's rerank (``bedrock-agent-runtime`` ``Rerank``) as an engine, through boto3.

Bedrock is not a bearer-key API: every call is signed with SigV4 from the AWS credential chain
(environment, shared files, an instance or task role), which the AWS SDK does; so this engine calls
boto3's client (in a worker thread: boto3 is synchronous) instead of the shared httpx client. The
rest is the hosted providers' machinery: the split into calls of at most ``max_documents_per_call``
sources and their merge, the gateway's retry policy (the SDK's own retries are turned off so the
request's deadline holds across attempts), and the same error classes:

- ``ValidationException`` (and a request the SDK refuses before sending it): the client's 422;
- ``ThrottlingException``, ``InternalServerException``, ``BadGatewayException`` (AWS: "retry your
  request"), and connections that fail or break: retried, then 503;
- ``AccessDeniedException``, ``ServiceQuotaExceededException``, a refused signature or key: 502 (the
  operator's account); ``ResourceNotFoundException``: 502 misconfigured (the model ARN);
- a read timeout: 504; anything else: 502.

Credentials never appear in a message or log line: the SDK's errors carry AWS's message only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import boto3
import botocore.config
import botocore.exceptions
import structlog

from adapters.base import (
    EngineAccountError,
    EngineConfigError,
    EngineError,
    EngineInputError,
    EngineMisconfiguredError,
    EngineTimeoutError,
    EngineUnavailableError,
    ScoreJob,
    ScoreResult,
)
from adapters.upstreams.hosted.providers import Outcome
from adapters.upstreams.http import RetryableUpstreamError
from adapters.upstreams.split import place_scores, score_texts
from schemas.config import BedrockEngineConfig

__all__ = ("BedrockEngine",)

log = structlog.get_logger("adapters.upstreams.bedrock")

# Rerank's documented exceptions (the botocore service model lists them) and what they mean here.
_CODES = {
    "ValidationException": Outcome.INPUT,
    "AccessDeniedException": Outcome.ACCOUNT,
    "ServiceQuotaExceededException": Outcome.ACCOUNT,
    "UnrecognizedClientException": Outcome.ACCOUNT,
    "InvalidSignatureException": Outcome.ACCOUNT,
    "ExpiredTokenException": Outcome.ACCOUNT,
    "ResourceNotFoundException": Outcome.MISCONFIGURED,
    "ThrottlingException": Outcome.RETRY,
    "InternalServerException": Outcome.RETRY,
    "BadGatewayException": Outcome.RETRY,
    "DependencyFailedException": Outcome.FAIL,
    "ConflictException": Outcome.FAIL,
}


class BedrockEngine:
    """:class:`adapters.base.RerankEngine` calling Bedrock's Rerank with boto3."""

    tokenizer = None

    def __init__(self, config: BedrockEngineConfig) -> None:
        self._config = config
        self._client: Any = None
        self._upstream = f"AWS Bedrock (model {config.model}, region {config.region})"

    async def start(self) -> None:
        cfg = self._config
        try:
            session = boto3.session.Session(profile_name=cfg.profile, region_name=cfg.region)
        except botocore.exceptions.ProfileNotFound:
            raise EngineConfigError(
                f"profile: no AWS profile named {cfg.profile!r} in the shared config files"
            ) from None
        if session.get_credentials() is None:
            raise EngineConfigError(
                "no AWS credentials: set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, a profile, or run with a role"
            )
        self._client = session.client(
            "bedrock-agent-runtime",
            endpoint_url=cfg.endpoint_url,
            config=botocore.config.Config(
                connect_timeout=cfg.connect_timeout_s,
                read_timeout=cfg.read_timeout_s,
                max_pool_connections=cfg.max_connections,
                retries={"total_max_attempts": 1, "mode": "standard"},  # the gateway retries, inside the deadline
            ),
        )

    async def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    async def check_health(self) -> None:
        # A probe would be a billed Rerank call on every /ready poll: failures surface per request.
        if self._client is None:
            raise EngineUnavailableError("the Bedrock client is not started")

    async def score(self, job: ScoreJob) -> ScoreResult:
        client = self._client
        if client is None:
            raise EngineUnavailableError("the Bedrock client is not started")
        # Rerank reports no usage: the estimate counts for it. Its only limit is documents per call.
        return await score_texts(job, lambda texts: self._call(client, job.query, texts), self._config)

    async def _call(self, client: Any, query: str, texts: Sequence[str]) -> tuple[list[float], int | None]:
        request = {
            "queries": [{"type": "TEXT", "textQuery": {"text": query}}],
            "sources": [
                {"type": "INLINE", "inlineDocumentSource": {"type": "TEXT", "textDocument": {"text": t}}} for t in texts
            ],
            "rerankingConfiguration": {
                "type": "BEDROCK_RERANKING_MODEL",
                "bedrockRerankingConfiguration": {
                    "numberOfResults": len(texts),  # every score: ordering and top_n are the gateway's
                    "modelConfiguration": {"modelArn": self._config.model_arn},
                },
            },
        }
        try:
            answer = await asyncio.to_thread(client.rerank, **request)
        except botocore.exceptions.ClientError as exc:
            raise self._client_error(exc) from None
        except (
            botocore.exceptions.ParamValidationError
        ) as exc:  # refused by the SDK before sending (e.g. an empty text)
            raise EngineInputError(f"Bedrock cannot take the request: {str(exc)[:300]}") from None
        except botocore.exceptions.ReadTimeoutError:
            raise EngineTimeoutError(
                f"{self._upstream} sent nothing for {self._config.read_timeout_s:g}s (read_timeout_s)"
            ) from None
        except (
            botocore.exceptions.EndpointConnectionError,
            botocore.exceptions.ConnectionClosedError,
            botocore.exceptions.ConnectTimeoutError,
        ) as exc:
            raise RetryableUpstreamError(f"{self._upstream} is unreachable ({type(exc).__name__})") from None
        except botocore.exceptions.BotoCoreError as exc:
            raise EngineError(f"{self._upstream} call failed ({type(exc).__name__})") from None
        try:
            results = [(int(r["index"]), float(r["relevanceScore"])) for r in answer["results"]]
        except (KeyError, TypeError, ValueError):
            raise EngineError(f"{self._upstream} returned a malformed response") from None
        return place_scores(results, len(texts), self._upstream), None

    def _client_error(self, exc: botocore.exceptions.ClientError) -> EngineError:
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        message = str(error.get("Message", ""))[:500]
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        outcome = _CODES.get(code) or _by_status(status)
        fields = {
            "model": self._config.name,
            "provider": "AWS Bedrock",
            "status": status,
            "code": code,
            "message": message,
        }
        if outcome is Outcome.INPUT:
            log.info("hosted_rejected_input", **fields)
            return EngineInputError(f"Bedrock rejected the request ({code or status}): {message}")
        if outcome is Outcome.ACCOUNT:
            log.error("hosted_account_refused", **fields)
            return EngineAccountError(f"{self._upstream} refused the gateway's credentials or account ({code})")
        if outcome is Outcome.MISCONFIGURED:
            log.error("hosted_upstream_misconfigured", **fields)
            return EngineMisconfiguredError(
                f"model '{self._config.name}' is misconfigured: Bedrock has no model '{self._config.model}' in "
                f"{self._config.region} (or no access to it); the gateway's operator must fix `model` or `region` "
                "(retrying will not help)"
            )
        if outcome is Outcome.RETRY:
            log.warning("hosted_retryable_error", **fields)
            return RetryableUpstreamError(f"Bedrock is unavailable or throttling ({code or status}); retry later")
        log.error("hosted_unexpected_status", **fields)
        return EngineError(f"{self._upstream} answered {code or status}: {message}")


def _by_status(status: int) -> Outcome:
    if status in (400, 413, 422):
        return Outcome.INPUT
    if status in (401, 403):
        return Outcome.ACCOUNT
    if status in (408, 429, 502, 503, 504):
        return Outcome.RETRY
    return Outcome.FAIL
