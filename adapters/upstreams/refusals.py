"""What a pool replica's final refusal means, and the error the gateway answers with.

:class:`adapters.upstreams.pool.PoolEngine` handles the answers that concern the replica's
health (429, 502, 503, 504: retried elsewhere, counted against it). Every other non-200 answer
is final for the request and says nothing about the replica, except the operator's mistakes on
that replica (a model that is not a reranker, a wrong `model`, another protocol's server or a
wrong path: :class:`EngineMisconfiguredError`, which the pool retries on its other replicas and
counts against this one); the others are the gateway's own credentials refused, the client's
input refused, or an upstream error. Reading
these apart from routing and health keeps the pool's hot path short, and puts every upstream's
wording (vLLM, TEI, Infinity, Cohere-compatible) in one place.
"""

from __future__ import annotations

import re

import structlog

from adapters.base import EngineAccountError, EngineError, EngineInputError, EngineMisconfiguredError
from adapters.upstreams.http import upstream_message

__all__ = ("refusal_error",)

# The pool's logger: these lines are the pool's (operators filter on its name).
log = structlog.get_logger("adapters.upstreams.pool")

# What vLLM (400 on older versions, 501 on newer), Infinity (400) and TEI (424) answer when the
# replica serves a model that cannot score pairs: an embedding or generative model, or a server
# started without a scoring runner. Nothing in the client's request can change that.
_NOT_A_RERANKER = re.compile(
    r"does not support\W+(the\W+)?(rerank|scor|pooling)|unsupported task|not a re-?ranker|only enabled for num_labels",
    re.IGNORECASE,
)
# What vLLM (404 "The model `x` does not exist."), Infinity (400 "Invalid model: Engine for model
# name `x` not found") and Cohere-compatible servers, rerank-gateway included (404 "model 'x' not
# found"), answer a `model` they do not serve: the pool's `model` setting is wrong.
_UNKNOWN_MODEL = re.compile(
    r"\bmodel\b.{0,300}?\b(does not exist|not found)|\binvalid model\b", re.IGNORECASE | re.DOTALL
)
# What a replica answers a body missing a field it requires: TEI (axum, 422 text), vLLM (400, its
# FastAPI validation handler) and Infinity (FastAPI's 422 `detail`, re-encoded by
# upstream_message). The gateway always sends its protocol's required fields, so this is another
# protocol's server on the same path (vLLM, TEI and Infinity all serve POST /rerank). Anchored at
# the start: FastAPI echoes the request's input after it, and a document's words must not match.
_MISSING_FIELD = re.compile(
    r"\A(Failed to deserialize the JSON body into the target type: missing field"
    r"|\d+ validation errors?:\s*\{'type': 'missing'"
    r"|\[\{\"type\":\"missing\")"
)


def refusal_error(
    status: int, content: bytes, *, model: str, replica: str, upstream_model: str | None, protocol: str, path: str
) -> EngineError:
    """The error for ``replica``'s answer ``status`` (not 200, 429 or 502-504) with body ``content``.

    ``model`` is the pool's name, ``upstream_model`` the name it sends, ``protocol`` its
    ``protocol`` setting and ``path`` that protocol's POST path."""
    upstream = f"replica {replica}"
    message, _ = upstream_message(content, f"HTTP {status}")
    # FastAPI's validation errors (Infinity's 422 `detail` list, as upstream_message re-encodes
    # it) echo the request's input: a document's words are not the upstream's verdict on its model.
    echoes_input = message.startswith('[{"type":')
    # The operator's mistakes, which no client request can change. The pool retries them on
    # another replica and counts them against this one when it has another (a half-migrated
    # pool); a pool of one answers them at once.
    if not echoes_input and _NOT_A_RERANKER.search(message):
        return _misconfigured(
            model, replica, upstream_model, status, message, "its upstream serves a model that is not a reranker; "
            "the gateway's operator must fix the upstream",
        )  # fmt: skip
    if status in (400, 404) and not echoes_input and _UNKNOWN_MODEL.search(message):
        # The client sees the setting to fix, not the served names the upstream lists (log).
        return _misconfigured(
            model, replica, upstream_model, status, message, "its upstream does not serve the model named in its "
            "`model` setting; the gateway's operator must set `model` to a name the upstream serves",
        )  # fmt: skip
    if status == 404:
        # Any other 404 is the route: another protocol's server, or a path in `urls`.
        return _misconfigured(
            model, replica, upstream_model, status, message, f"its upstream has no POST {path} route; "
            "the gateway's operator must fix its `protocol` or `urls`",
        )  # fmt: skip
    if status in (400, 422) and _MISSING_FIELD.search(message):
        return _misconfigured(
            model, replica, upstream_model, status, message, f"its upstream does not take the `{protocol}` "
            f"protocol's request on POST {path}; the gateway's operator must fix its `protocol` or `urls`",
        )  # fmt: skip
    if status in (401, 403):
        # The gateway's api_key, not the client's: the client gets the generic 502.
        log.error("pool_upstream_auth_failed", model=model, replica=replica, status=status,
                  message=message)  # fmt: skip
        return EngineAccountError(f"{upstream} refused the gateway's credentials (HTTP {status})")
    if status in (400, 413, 422):
        # The input itself (too long for max_model_len, too many texts): the client's to fix.
        return EngineInputError(f"upstream rejected the request: {message}")
    # A 500 is not counted against the replica: one poisonous input would otherwise eject
    # every healthy replica in turn.
    log.error("pool_upstream_error", model=model, replica=replica, status=status, message=message)
    return EngineError(f"{upstream} answered HTTP {status}: {message}")


def _misconfigured(
    model: str, replica: str, upstream_model: str | None, status: int, message: str, what: str
) -> EngineMisconfiguredError:
    """The error for an upstream answer only the operator can fix; the details go to the log."""
    log.error(
        "pool_upstream_misconfigured",
        model=model,
        replica=replica,
        upstream_model=upstream_model,
        status=status,
        message=message,
    )
    return EngineMisconfiguredError(f"model '{model}' is misconfigured: {what} (retrying will not help)")
