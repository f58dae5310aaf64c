"""Hugging Face Text Embeddings Inference (TEI): its ``/rerank`` body, ``/info`` and errors.

TEI's ``RerankRequest`` (``query``, ``texts``, ``truncate``, ``truncation_direction``,
``raw_scores``, ``return_text``) has no model field: it is served by ``dialects.tei_model`` (the
first model by default). The answer is TEI's bare array of ``{index, score, text?}`` sorted by
descending score (ties by index, as on the Cohere routes, whose scores it equals).

``truncate`` maps onto :class:`gateway.serving.service.LongTexts`: absent or null keeps the gateway's
chunk-and-max (TEI's own default is a server flag, ``--auto-truncate``); ``true`` cuts each text
to the room the window leaves it, at the end (``Right``) or the start (``Left``), in tokens;
``false`` answers TEI's 413 for a text that does not fit.

Errors use TEI's body ``{"error", "error_type"}`` and TEI's codes where TEI's differ from the
gateway's table (``router/src/http/server.rs``, ``From<&ErrorType> for StatusCode``): an empty
``texts`` is 400 ``Empty``, too many texts and too-long texts 413 ``Validation``, a full model
queue 429 ``Overloaded``, a model that cannot serve 503 ``Unhealthy``, an engine failure or a
model without raw scores 424 ``Backend``. Everything else keeps the gateway's status.
"""

from __future__ import annotations

from typing import Any, Final, Literal

from litestar import Request, Response, get
from litestar.datastructures import State

from adapters.base import EngineError, EngineOverloadedError, EngineTimeoutError
from gateway import __version__
from gateway.errors import (
    MalformedRequestError,
    PayloadTooLargeError,
    RawScoresUnsupportedError,
    describe_error,
)
from gateway.http.dialects.common import finish
from gateway.http.middleware import request_id
from gateway.security.auth import authorize_model
from gateway.serving.models import ModelRegistry, ModelRuntime
from gateway.serving.service import CHUNK, LongTexts, RerankService
from schemas.config import Settings
from schemas.dialects import (
    TeiClassifierModel,
    TeiError,
    TeiErrorType,
    TeiInfo,
    TeiModelType,
    TeiRank,
    TeiRerankRequest,
)
from schemas.rerank import RerankRequest

__all__ = ("TEI", "is_tei", "mark_tei", "tei_error_response", "tei_info", "tei_rerank")

TEI: Final = "tei"
_SCOPE_KEY: Final = "dialect"
# TEI reports an input window for every model; for upstream engines the gateway does not know
# the upstream's, so /info reports TEI's usual 512 there.
_UNKNOWN_WINDOW: Final = 512


class EmptyTextsError(MalformedRequestError):
    """TEI answers an empty ``texts`` with 400 ``Empty`` (the Cohere routes' 422 for no documents)."""


def mark_tei(exc: Exception) -> Exception:
    """Tag an exception raised while decoding a TEI body, before the request knows its dialect."""
    exc.dialect = TEI  # type: ignore[attr-defined]
    return exc


def is_tei(request: Request[Any, Any, Any], exc: Exception) -> bool:
    state = request.scope.get("state", {})
    return getattr(exc, "dialect", None) == TEI or state.get(_SCOPE_KEY) == TEI


def _tei_model(settings: Settings) -> str | None:
    return settings.dialects.tei_model


async def tei_rerank(request: Request[Any, Any, Any], body: TeiRerankRequest) -> Response[list[TeiRank]]:
    """Answer a TEI-shaped ``/rerank`` body (called by the shared ``/rerank`` route)."""
    request.scope.setdefault("state", {})[_SCOPE_KEY] = TEI  # errors from here on are TEI's
    settings: Settings = request.app.state.settings
    service: RerankService = request.app.state.service
    registry: ModelRegistry = request.app.state.registry
    # 404/403 before the texts are looked at, as on the Cohere routes: a key without the model
    # learns nothing about the limits.
    authorize_model(registry.get(_tei_model(settings)).name)
    if not body.texts:
        raise EmptyTextsError("`texts` cannot be empty")
    limit = settings.limits.max_documents
    if len(body.texts) > limit:
        raise PayloadTooLargeError(f"batch size {len(body.texts)} > maximum allowed batch size {limit}")
    if body.truncate is None:
        long_texts = CHUNK
    else:
        side: Literal["left", "right"] = "left" if body.truncation_direction.lower() == "left" else "right"
        long_texts = LongTexts(mode="truncate" if body.truncate else "reject", side=side)
    cohere = RerankRequest(
        query=body.query, documents=list(body.texts), model=_tei_model(settings), return_documents=False
    )
    outcome = await service.rerank(
        cohere,
        api_version="1",
        request_id=request_id(request.scope),
        long_texts=long_texts,
        raw_scores=body.raw_scores,
    )
    texts = body.texts if body.return_text else None
    ranks = [
        TeiRank(index=r.index, score=r.relevance_score, text=texts[r.index] if texts is not None else None)
        for r in outcome.response.results
    ]
    return Response(ranks, status_code=200, headers=finish(TEI, [outcome], len(body.texts)))


def tei_error_response(request: Request[Any, Any, Any], exc: Exception) -> Response[TeiError]:
    status, message, _, headers = describe_error(request, exc)
    kind: TeiErrorType
    if isinstance(exc, EmptyTextsError):
        kind = "Empty"
    elif isinstance(exc, RawScoresUnsupportedError):
        status, kind = 424, "Backend"  # TEI: "model is not a re-ranker model" is Backend too
    elif isinstance(exc, EngineOverloadedError) or status == 429:
        status, kind = 429, "Overloaded"
    elif status == 503:
        kind = "Unhealthy"
    elif isinstance(exc, EngineTimeoutError):
        kind = "Backend"  # TEI has no time limit; keep the gateway's 504
    elif isinstance(exc, EngineError) or status == 502:
        status, kind = 424, "Backend"
    else:
        kind = "Validation"
    return Response(TeiError(error=message, error_type=kind), status_code=status, headers=headers)


@get("/info", tags=["tei"], summary="Model info (TEI's GET /info)", operation_id="tei_info")
async def tei_info(state: State) -> TeiInfo:
    """The model serving TEI-shaped requests, in TEI's ``Info`` shape (type ``reranker``)."""
    settings: Settings = state.settings
    registry: ModelRegistry = state.registry
    runtime = registry.get(_tei_model(settings))
    cfg: Any = runtime.config
    window = _window(runtime)
    return TeiInfo(
        model_id=runtime.name,
        model_sha=getattr(cfg, "revision", None),
        model_dtype=str(getattr(cfg, "dtype", "float32")),
        model_type=TeiModelType(reranker=TeiClassifierModel(id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0})),
        max_concurrent_requests=cfg.max_concurrent_requests,
        max_input_length=window,
        max_batch_tokens=getattr(cfg, "batch_tokens", None) or getattr(cfg, "max_num_batched_tokens", None) or window,
        max_batch_requests=getattr(cfg, "max_batch_size", None) or getattr(cfg, "max_num_seqs", None),
        max_client_batch_size=settings.limits.max_documents,
        # Over-long texts are chunked (or cut, with truncate: true); only truncate: false errors.
        auto_truncate=True,
        tokenization_workers=1,
        version=__version__,
    )


def _window(runtime: ModelRuntime) -> int:
    tokenizer = runtime.engine.tokenizer if runtime.engine is not None else None
    if tokenizer is not None:
        return tokenizer.max_length
    cfg: Any = runtime.config
    return getattr(cfg, "max_length", None) or getattr(cfg, "max_tokens_per_item", None) or _UNKNOWN_WINDOW
