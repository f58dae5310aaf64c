"""``[[models]]`` entries scored by a hosted rerank API: Cohere, Jina AI, Voyage AI, Mixedbread,
NVIDIA NIM / API catalog, Together, and AWS Bedrock. One engine kind per provider (the provider is a
type, not a string compared in code); what the bearer-key APIs share -- the key, the limits a call is
split by, retries -- is :class:`HostedRerankConfig`; Bedrock signs with AWS credentials instead
(:class:`BedrockEngineConfig`). The wire formats and where each limit comes from: docs/upstreams.md.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from .base import ModelConfig, ModelName, Positive, PositiveFloat
from .upstream import UpstreamHttpConfig

__all__ = (
    "NVIDIA_CATALOG_URL",
    "BedrockEngineConfig",
    "CohereEngineConfig",
    "HostedRerankConfig",
    "JinaEngineConfig",
    "MixedbreadEngineConfig",
    "NvidiaEngineConfig",
    "TogetherEngineConfig",
    "VoyageEngineConfig",
)

# NVIDIA's hosted API catalog: it needs a key; a self-hosted NIM (any other base_url) may not.
NVIDIA_CATALOG_URL = "https://ai.api.nvidia.com"


class HostedRerankConfig(UpstreamHttpConfig, kw_only=True, frozen=True):
    """Fields every hosted provider shares. The key is read from ``api_key``, else ``api_key_file``,
    else the environment variable ``api_key_env``; it is sent as ``Authorization: Bearer`` only."""

    # The provider's model name (rerank-v3.5, jina-reranker-v2-base-multilingual, rerank-2.5, ...).
    model: ModelName
    # Base URL of the provider's API (each provider's default is its public one); `path` is appended.
    base_url: str
    path: str  # the rerank call's path under base_url (each provider's default is its documented one)
    # A file holding the key (e.g. a mounted Kubernetes secret); surrounding whitespace is ignored.
    api_key_file: str | None = None
    # Documents in one upstream call: a larger request is split into calls and merged in order.
    max_documents_per_call: Positive = 1000
    # Tokens one call may hold, counted as query tokens x documents + document tokens (None: no such limit).
    max_tokens_per_request: Positive | None = None
    # Tokens one document counts for at most in that budget (the provider truncates longer ones).
    max_tokens_per_item: Positive = 8192
    max_parallel_calls: Positive = 4  # upstream calls of one split request in flight at once
    # Retries of one call after the provider's retryable answers (429, and the 5xx its docs say to retry).
    retries: Annotated[int, msgspec.Meta(ge=0, le=10)] = 3
    backoff_initial_s: PositiveFloat = 0.5  # first retry delay, doubled each time (with jitter) ...
    backoff_max_s: PositiveFloat = 10.0  # ... up to this, and never sooner than the provider's Retry-After

    def __post_init__(self) -> None:
        if self.api_key is not None and self.api_key_file is not None:
            raise ValueError("api_key and api_key_file are both set: keep one (a key in the file, or the file's path)")
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(
                f"base_url must start with http:// or https:// (got a URL of {len(self.base_url)} characters)"
            )
        if not self.path.startswith("/"):
            raise ValueError("path must start with '/' (it is appended to base_url)")


class CohereEngineConfig(HostedRerankConfig, tag="cohere", kw_only=True, frozen=True):
    """Cohere's v2 rerank (``POST /v2/rerank``)."""

    base_url: str = "https://api.cohere.com"  # the provider's public API
    path: str = "/v2/rerank"  # its documented rerank path
    api_key_env: str | None = "CO_API_KEY"  # the environment variable holding the key (Cohere's SDK reads CO_API_KEY)
    # Cohere truncates each document to this many tokens (its default, 4096); a request's smaller value wins.
    max_tokens_per_doc: Positive = 4096
    # Cohere sends a request to the model with this priority (0 first, 999 last; None: omitted).
    priority: Annotated[int, msgspec.Meta(ge=0, le=999)] | None = None


class JinaEngineConfig(HostedRerankConfig, tag="jina", kw_only=True, frozen=True):
    """Jina AI's rerank (``POST /v1/rerank``)."""

    base_url: str = "https://api.jina.ai"  # the provider's public API
    path: str = "/v1/rerank"  # its documented rerank path
    api_key_env: str | None = "JINA_API_KEY"  # the environment variable holding the key


class VoyageEngineConfig(HostedRerankConfig, tag="voyage", kw_only=True, frozen=True):
    """Voyage AI's rerank (``POST /v1/rerank``)."""

    base_url: str = "https://api.voyageai.com"  # the provider's public API
    path: str = "/v1/rerank"  # its documented rerank path
    api_key_env: str | None = "VOYAGE_API_KEY"  # the environment variable holding the key
    # Voyage's total limit for rerank-2.5 / rerank-2 (query tokens x documents + document tokens per call).
    max_tokens_per_request: Positive | None = 600_000
    # rerank-2.5's context (query + one document); Voyage truncates longer ones while truncation is on.
    max_tokens_per_item: Positive = 32_000
    # Voyage's `truncation`: true cuts a long query or document to the model's context; false makes it a 400.
    truncation: bool = True


class MixedbreadEngineConfig(HostedRerankConfig, tag="mixedbread", kw_only=True, frozen=True):
    """Mixedbread's reranking (``POST /v1/reranking``)."""

    base_url: str = "https://api.mixedbread.com"  # the provider's public API
    path: str = "/v1/reranking"  # its documented rerank path
    api_key_env: str | None = "MXBAI_API_KEY"  # the environment variable holding the key (Mixedbread's SDKs read it)


class NvidiaEngineConfig(HostedRerankConfig, tag="nvidia", kw_only=True, frozen=True):
    """NVIDIA's reranking: the API catalog, or a self-hosted NIM's ``POST /v1/ranking``."""

    # The API catalog; a self-hosted NIM is e.g. base_url = "http://nim:8000", path = "/v1/ranking".
    base_url: str = NVIDIA_CATALOG_URL
    # The catalog's path for nv-rerankqa-mistral-4b-v3; other catalog models have their own (docs/upstreams.md).
    path: str = "/v1/retrieval/nvidia/reranking"
    # The environment variable holding the key; a self-hosted NIM (any other base_url) may run without one.
    api_key_env: str | None = "NVIDIA_API_KEY"
    # The NIM's passage limit per request.
    max_documents_per_call: Positive = 512
    # NIM's `truncate`: "END" cuts a pair over the model's window, "NONE" makes it an error.
    truncate: Literal["NONE", "END"] = "END"


class TogetherEngineConfig(HostedRerankConfig, tag="together", kw_only=True, frozen=True):
    """Together AI's rerank (``POST /v1/rerank``, Cohere's shape)."""

    base_url: str = "https://api.together.xyz"  # the provider's public API
    path: str = "/v1/rerank"  # its documented rerank path
    api_key_env: str | None = "TOGETHER_API_KEY"  # the environment variable holding the key


class BedrockEngineConfig(ModelConfig, tag="bedrock", kw_only=True, frozen=True):
    """AWS Bedrock's rerank (``bedrock-agent-runtime`` ``Rerank``), signed with SigV4 by the AWS SDK (boto3).

    Credentials come from the AWS default chain (environment, shared files, a role), never from this file.
    """

    # The Bedrock model id (amazon.rerank-v1:0, cohere.rerank-v3-5:0), or a model ARN.
    model: ModelName
    region: str  # the AWS region (us-west-2, eu-central-1, ...): the endpoint's, and the model ARN's
    endpoint_url: str | None = None  # e.g. a VPC endpoint; None: the region's public bedrock-agent-runtime endpoint
    profile: str | None = None  # an AWS profile of the shared config files; None: the default credential chain
    connect_timeout_s: PositiveFloat = 5.0  # longest wait for a TCP + TLS connection to Bedrock
    read_timeout_s: PositiveFloat = 30.0  # longest wait for Bedrock's answer to one call
    max_connections: Positive = 64  # the SDK's connection pool (max_pool_connections)
    # Sources in one Rerank call (Bedrock's limit: 1000); a larger request is split into calls and merged in order.
    max_documents_per_call: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 1000
    max_parallel_calls: Positive = 4  # Rerank calls of one split request in flight at once
    # Retries of one call after throttling or Bedrock's retryable faults (the SDK's own retries are off).
    retries: Annotated[int, msgspec.Meta(ge=0, le=10)] = 3
    backoff_initial_s: PositiveFloat = 0.5  # first retry delay, doubled each time (with jitter) ...
    backoff_max_s: PositiveFloat = 10.0  # ... up to this

    @property
    def model_arn(self) -> str:
        """``model`` as Rerank's ``modelArn``: an ARN as it is, a model id as its foundation-model ARN."""
        if self.model.startswith("arn:"):
            return self.model
        return f"arn:aws:bedrock:{self.region}::foundation-model/{self.model}"
