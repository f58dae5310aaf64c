"""The one protocol every engine and upstream implements, and the errors they may raise.

An engine scores items and returns one score per item, in order. Everything a client asked
for beyond that -- rank fields, dedup, truncation, chunk-and-max, sorting, top_n, echoing
documents -- is done once in ``gateway.serving`` (``jobs``, ``scoring``, ``service``), never in an engine.

Two kinds of engines exist and the protocol covers both:

- token engines (transformers, vLLM) expose a :class:`PromptTokenizer`; the service tokenizes,
  truncates and chunks, and hands them token ids: the shared part (template + instruction +
  query) once, then one id list per item. They build ``shared + item + suffix`` themselves.
- text engines (DashScope, remote pools) expose ``tokenizer = None`` and get texts.

This module imports only the standard library and msgspec: the gateway imports it at start,
engines with heavy dependencies are imported lazily by ``adapters.registry``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import msgspec

__all__ = (
    "EngineAccountError",
    "EngineConfigError",
    "EngineDeadError",
    "EngineError",
    "EngineInputError",
    "EngineMisconfiguredError",
    "EngineObserver",
    "EngineOverloadedError",
    "EngineTimeoutError",
    "EngineUnavailableError",
    "PromptTokenizer",
    "RerankEngine",
    "ScoreJob",
    "ScoreResult",
)


class ScoreJob(msgspec.Struct, kw_only=True, frozen=True):
    """What one request asks an engine to score. One score is expected per item."""

    query: str
    instruction: str
    # Text engines: one text per item.
    texts: Sequence[str] = ()
    # Token engines: the shared prompt part (template head, instruction, query) ...
    shared_ids: Sequence[int] = ()
    # ... and one token id list per item (a whole document or one chunk of it).
    item_ids: Sequence[Sequence[int]] = ()
    # Forwarded to text engines that truncate themselves; token engines were truncated already.
    max_tokens_per_doc: int | None = None
    # Return the model's raw output (e.g. a cross-encoder's logit) instead of a score in [0, 1].
    # Only engines whose ``supports_raw_scores`` is true are given such a job.
    raw_scores: bool = False
    # A hint, never a requirement: the caller keeps only the ``top_n`` best items, so an engine
    # that can rank remotely (an upstream with a ``top_n`` field) may return just those, naming
    # them in ``ScoreResult.indices``. Set only when every item stands alone (no duplicates
    # folded into one item, no chunks whose max is taken); engines that ignore it return all.
    top_n: int | None = None

    @property
    def size(self) -> int:
        return len(self.item_ids) if self.item_ids else len(self.texts)


class ScoreResult(msgspec.Struct, kw_only=True, frozen=True):
    # One score per item in order; or, when ``indices`` is set, the score of item ``indices[k]``.
    scores: list[float]
    # Tokens the engine processed for this job (for usage, billing and rate limits).
    input_tokens: int
    # Only for a job with ``top_n``: the items scored, exactly min(top_n, size) distinct ones.
    indices: list[int] | None = None
    # Seconds the job waited inside the engine for a free slot before its first step ran
    # (0 for engines without a queue of their own, or whose queue they cannot see).
    queue_s: float = 0.0


# Optional capabilities an engine may have beside the protocol below (read with getattr, so
# engines without them need nothing): ``queue_depth() -> int``, the jobs waiting for their first
# step (the ``rerank_queued_requests`` gauge); ``expected_wait_s() -> float``, how long a job
# submitted now would wait, from its own queue and recent step times (a fallback chain's
# spill-over, gateway.serving.routing.saturation); ``stats()`` and ``describe()`` for /ready.


class EngineObserver(Protocol):
    """What an engine tells the gateway's metrics about its work; engines that can report it
    have a writable ``observer`` attribute, which the gateway sets before ``start``.

    Kept as a protocol here so engines never import the metrics library.
    """

    def step(self, *, rows: int, tokens: int) -> None:
        """One engine step (a forward pass / scheduler iteration) ran ``rows`` items, ``tokens`` tokens."""
        ...

    def prefix_cache(self, *, queries: int, hits: int) -> None:
        """Prompt tokens looked up in the engine's prefix cache, and how many were found there."""
        ...


@runtime_checkable
class PromptTokenizer(Protocol):
    """Tokenizes the parts of a reranker prompt so the service can truncate and chunk."""

    @property
    def max_length(self) -> int:
        """Most tokens one full prompt (shared + item + suffix) may hold."""
        ...

    @property
    def suffix_length(self) -> int: ...

    def encode_shared(self, query: str, instruction: str) -> list[int]:
        """Template head + instruction + query (the query already truncated as configured)."""
        ...

    def item_room(self, shared_ids: Sequence[int]) -> int:
        """Most tokens one item (a document or one chunk of it) may hold beside ``shared_ids``.

        Pair and prompt families put the shared part and the item in one sequence
        (``max_length - len(shared) - suffix``); a bi-encoder embeds them apart, so its room
        does not depend on the query.
        """
        ...

    def encode_documents(self, documents: Sequence[str]) -> list[list[int]]:
        """Token ids of each document as it appears inside the prompt."""
        ...


@runtime_checkable
class RerankEngine(Protocol):
    """An engine or upstream behind one public model name."""

    @property
    def tokenizer(self) -> PromptTokenizer | None:
        """Set for token engines (valid once ``start`` returned); None for text engines."""
        ...

    async def start(self) -> None:
        """Load weights / open connections; raise (any exception) if the model cannot serve."""
        ...

    async def stop(self) -> None:
        """Release everything ``start`` took. Called once, also after a failed start."""
        ...

    async def check_health(self) -> None:
        """Raise :class:`EngineUnavailableError` when the engine cannot serve right now."""
        ...

    async def score(self, job: ScoreJob) -> ScoreResult:
        """Return one score per item of ``job``, in order: in [0, 1], or raw when ``job.raw_scores``.

        With ``job.top_n`` set, an engine may instead return the ``top_n`` best items' scores
        and their ``indices``.
        """
        ...


class EngineError(Exception):
    """The engine failed to produce scores (a server-side fault: 502)."""


class EngineUnavailableError(EngineError):
    """The engine is not loaded, restarting or dead; the client may retry later (503)."""

    def __init__(self, message: str, *, retry_after: int = 5) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class EngineDeadError(EngineUnavailableError):
    """The engine crashed (e.g. vLLM's engine core died); the gateway restarts it (503 meanwhile)."""


class EngineOverloadedError(EngineUnavailableError):
    """The engine's queue is full (503 with Retry-After)."""


class EngineTimeoutError(EngineError):
    """The engine did not answer in time (504): within the model's ``timeout_s``, an upstream
    replica within its pool's ``read_timeout_s``, or the upstream answered 504 itself. The message
    names which and the limit (logged; clients get a generic text)."""


class EngineInputError(EngineError):
    """The engine (or upstream) rejected the input itself; the client must change it (422)."""


class EngineMisconfiguredError(EngineError):
    """The engine or upstream is set up so that it cannot score at all (e.g. a pool replica serves
    a model that is not a reranker): the operator's to fix, not the client's (502). The message is
    written by the gateway, with no upstream text or address in it: clients read it."""


class EngineAccountError(EngineError):
    """The upstream refused the gateway's own account or credentials (a rejected key, an overdue
    DashScope account): the operator's to fix (502). Unlike :class:`EngineMisconfiguredError` the
    client gets the generic 502 message: the state of the operator's account is not its business."""


class EngineConfigError(ValueError):
    """The model's config cannot work (raised at start). The message is written by the gateway,
    names the setting and how to fix it, and holds no library text: clients may read it in 503s."""
