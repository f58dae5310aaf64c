"""From a request's documents to the engine's job: the request -> ``ScoreJob`` half of the rerank service.

Take each document's rank text (``text`` or the joined ``rank_fields``), dedup identical texts
(scored once, the score copied to every position), and for token engines tokenize (in a worker
thread when the texts are long), truncate to ``max_tokens_per_doc``, split documents longer than
the model's window into chunks (capped by ``max_chunks_per_doc``, and per request by
``limits.max_total_chunks``) whose max is the document's score, or cut or refuse them as
:class:`LongTexts` asks. :class:`gateway.serving.scoring.Scorer` calls these and makes the
engine call; :class:`gateway.serving.service.RerankService` does the rest (keys, cache, limits,
the response). Nothing here imports Litestar.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from typing import Any, Literal, TypeGuard

import anyio.to_thread
import msgspec

from adapters.base import PromptTokenizer, ScoreJob
from gateway.errors import InputTooLongError, InvalidRequestError, PayloadTooLargeError
from gateway.serving.models import ModelRuntime
from schemas.config import LimitsConfig

__all__ = (
    "CHUNK",
    "CUT_RIGHT",
    "LongTexts",
    "check_total_chunks",
    "chunk_ids",
    "dedup",
    "rank_texts",
    "token_job",
    "top_n_hint",
    "wants_raw_scores",
)

# Above this many characters, tokenization moves to a worker thread (the Rust tokenizer
# releases the GIL there); below it, the hop costs more than it saves. Measured on the H200
# (docs/benchmarks/gpu-h200-2026-11-30, run 3): lowering this to 2 kB, so 100-document
# requests tokenize in threads, tripled tokenize time under 16 clients (66 vs 23 ms per
# request: the Python side of the fast tokenizer contends for the GIL), so it stays high.
_THREAD_TOKENIZE_CHARS = 16_384
_json = msgspec.json.Encoder()


class LongTexts(msgspec.Struct, kw_only=True, frozen=True):
    """What to do with a document longer than the room the model's window leaves it.

    ``chunk`` (the gateway's default): split into chunks, score each, keep the max.
    ``truncate``: keep one window's worth of tokens, the first (``side="right"`` cuts the end)
    or the last (``side="left"``). ``reject``: answer 413 naming the lengths (TEI ``truncate:
    false``). Text engines (upstreams) truncate at the end themselves: they take ``chunk`` and
    ``truncate``/right only.
    """

    mode: Literal["chunk", "truncate", "reject"] = "chunk"
    side: Literal["right", "left"] = "right"


CHUNK = LongTexts()
CUT_RIGHT = LongTexts(mode="truncate", side="right")


def dedup(texts: Sequence[str]) -> tuple[list[str], Sequence[int]]:
    """Unique texts in first-seen order, and for every input position its unique index."""
    if len(dict.fromkeys(texts)) == len(texts):  # no duplicates (the usual case): one C-level pass
        return list(texts), range(len(texts))
    index_of: dict[str, int] = {}
    positions = [index_of.setdefault(t, len(index_of)) for t in texts]
    return list(index_of), positions


def chunk_ids(ids: Sequence[int], size: int, max_chunks: int) -> list[Sequence[int]]:
    """Split into consecutive pieces of ``size`` tokens, keeping at most ``max_chunks``."""
    if not ids:
        return [ids]
    return [ids[i : i + size] for i in range(0, len(ids), size)][:max_chunks]


async def token_job(
    limits: LimitsConfig,
    tokenizer: PromptTokenizer,
    query: str,
    instruction: str,
    unique: list[str],
    max_tokens: int | None,
    max_chunks: int,
    long_texts: LongTexts = CHUNK,
    raw_scores: bool = False,
) -> tuple[ScoreJob, list[int]]:
    def encode() -> tuple[list[int], list[list[int]]]:
        return tokenizer.encode_shared(query, instruction), tokenizer.encode_documents(unique)

    if sum(map(len, unique)) > _THREAD_TOKENIZE_CHARS:
        shared, doc_ids = await anyio.to_thread.run_sync(encode)
    else:
        shared, doc_ids = encode()
    room = tokenizer.item_room(shared)
    if room < 1:
        # The query is capped (max_query_tokens), the instruction is not: a long one sent with the
        # request is what gets here (or a misconfigured model).
        raise InvalidRequestError(
            f"invalid request: the prompt template, query and instruction take {len(shared)} tokens and "
            f"leave no room for documents in the model's {tokenizer.max_length}-token window; "
            "send a shorter `instruction`"
        )
    items: list[Sequence[int]] = []
    owners: list[int] = []
    for owner, ids in enumerate(doc_ids):
        if max_tokens is not None:
            ids = ids[:max_tokens]
        if long_texts.mode == "chunk":
            pieces = chunk_ids(ids, room, max_chunks)
        elif len(ids) <= room:
            pieces = [ids]
        elif long_texts.mode == "truncate":
            pieces = [ids[:room] if long_texts.side == "right" else ids[len(ids) - room :]]
        else:
            # What the model would read: the window less the room it leaves a text, plus the text.
            # A pair family's room is left beside the query; a bi-encoder reads the text alone.
            total = tokenizer.max_length - room + len(ids)
            raise InputTooLongError(
                f"Input validation error: `inputs` must have less than {tokenizer.max_length} tokens. "
                f"Given: {total}; send `truncate: true` to cut long texts"
            )
        for piece in pieces:
            items.append(piece)
            owners.append(owner)
    check_total_chunks(limits, len(items))
    job = ScoreJob(query=query, instruction=instruction, shared_ids=shared, item_ids=items, raw_scores=raw_scores)
    return job, owners


def check_total_chunks(limits: LimitsConfig, chunks: int) -> None:
    """413 when a request's documents split into more than ``limits.max_total_chunks`` chunks."""
    if chunks > limits.max_total_chunks:
        raise PayloadTooLargeError(
            f"too many chunks: the documents split into {chunks} chunks > "
            f"{limits.max_total_chunks} (limits.max_total_chunks); lower max_chunks_per_doc "
            "or max_tokens_per_doc, or send fewer documents"
        )


def wants_raw_scores(runtime: ModelRuntime, engine: Any) -> bool:
    """The model is configured for raw outputs (``raw_scores = true``) and its engine has them.

    ``create_family`` refuses ``raw_scores = true`` at start for families without raw outputs,
    so a started engine that lacks them means the model simply was not asked for them.
    """
    return bool(getattr(runtime.config, "raw_scores", False)) and bool(getattr(engine, "supports_raw_scores", False))


def top_n_hint(top_n: int | None, documents: int, unique: int) -> int | None:
    """``ScoreJob.top_n`` when the engine may cut: a real cut and no duplicates folded together
    (a folded item stands for several documents, so the best items are not the best documents)."""
    if top_n is None or top_n >= documents or unique != documents:
        return None
    return top_n


def _all_strings(documents: Sequence[str | dict[str, Any]]) -> TypeGuard[Sequence[str]]:
    return all(map(isinstance, documents, repeat(str)))


def rank_texts(documents: Sequence[str | dict[str, Any]], rank_fields: list[str] | None) -> list[str]:
    """The text each document is ranked on."""
    if rank_fields is not None and not rank_fields:
        raise InvalidRequestError(
            "invalid request: rank_fields cannot be empty, it must either contain at least one field or be omitted"
        )
    if rank_fields is None and _all_strings(documents):
        return list(documents)  # plain strings (the usual case): checked at C speed
    texts: list[str] = []
    for i, doc in enumerate(documents):
        if isinstance(doc, str):
            texts.append(doc)
        elif rank_fields:
            parts = [f"{f}: {_field_text(doc[f])}" for f in rank_fields if f in doc and doc[f] is not None]
            if not parts and isinstance(doc.get("text"), str):
                parts = [doc["text"]]  # none of the fields: its text, so every schema-valid request ranks
            if not parts:
                raise InvalidRequestError(
                    f"invalid request: document {i} has none of the rank_fields {rank_fields} and no 'text'"
                )
            texts.append("\n".join(parts))
        else:
            text = doc.get("text")
            if not isinstance(text, str):
                kind = (
                    "an image document (not supported)" if "image" in doc else "an object without a string 'text' field"
                )
                raise InvalidRequestError(
                    f"invalid request: document {i} is {kind}; send a 'text' field or name the fields "
                    "to rank on with rank_fields"
                )
            texts.append(text)
    return texts


def _field_text(value: Any) -> str:
    return value if isinstance(value, str) else _json.encode(value).decode()
