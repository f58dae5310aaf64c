"""A request's documents tokenized in runs on threads (``tokenize_threads``): the same ids, the same jobs.

Every family the project builds tiny tokenizers for (BERT WordPiece, XLM-R Unigram, ModernBERT
BPE, a bi-encoder, the LLM rerankers' byte-level BPE: Qwen3, Gemma, Qwen2/mxbai), loaded through
its family with ``tokenize_threads`` set, must give what one ``encode_batch`` call gives: the ids
of every document in order, and so the same ``token_job`` (chunks, truncation on both sides,
``max_tokens_per_doc``, ``max_chunks``, and the same refusals).
"""

from __future__ import annotations

import itertools
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest

from adapters.families import create_family
from adapters.families.split_encode import SPLIT_MIN_DOCUMENTS, SplitEncoder, resolve_tokenize_threads, split_bounds
from gateway.errors import InputTooLongError
from gateway.serving.jobs import CHUNK, LongTexts, token_job
from schemas.config import LimitsConfig, TransformersEngineConfig
from tests.tiny_encoders import build_tiny_bi_encoder, build_tiny_cross_encoder, build_tiny_modernbert

_WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "rerank",
    "gateways",
    "score",
    "documents",
]
_UNICODE = [
    "naïve café déjà vu",
    "東京 タワー 北京",
    "🙂🚀 emoji",
    "e\u0301 combining",
    "مرحبا بالعالم",
    "\u00a0 \t\n ",
]


def _documents(count: int = 3 * SPLIT_MIN_DOCUMENTS) -> list[str]:
    """Short, empty, unicode and long (past a tiny model's window) documents, in a fixed order."""
    docs = []
    for i in range(count):
        if i % 11 == 0:
            docs.append("")
        elif i % 7 == 0:
            docs.append(_UNICODE[i % len(_UNICODE)])
        elif i % 5 == 0:
            docs.append(" ".join(_WORDS[(i + k) % len(_WORDS)] for k in range(400 + i)))  # chunks
        else:
            docs.append(" ".join(_WORDS[(i * k) % len(_WORDS)] for k in range(1, 3 + i % 13)))
    return docs


_BUILDERS: dict[str, Any] = {
    "bert": lambda out: build_tiny_cross_encoder(out, kind="bert"),
    "xlmr": lambda out: build_tiny_cross_encoder(out, kind="xlmr"),
    "modernbert": build_tiny_modernbert,
    "bi-encoder": build_tiny_bi_encoder,
}


@pytest.fixture(scope="module", params=[*_BUILDERS, "qwen3", "gemma", "qwen2"])
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    if request.param in _BUILDERS:
        return Path(_BUILDERS[request.param](tmp_path_factory.mktemp(request.param)))
    return Path(request.getfixturevalue(f"tiny_{request.param}_dir"))


def _tokenizer(model_dir: Path, threads: int | str) -> Any:
    cfg = TransformersEngineConfig(
        name="m", path=str(model_dir), max_length=256, max_query_tokens=16, tokenize_threads=threads
    )
    return create_family(cfg, "transformers").load_tokenizer()


def test_runs_on_threads_give_one_calls_ids(model_dir: Path) -> None:
    one, split = _tokenizer(model_dir, 1), _tokenizer(model_dir, 3)
    assert split._split.threads == 3  # the config's value reached the family's tokenizer
    docs = _documents()
    expected = one.encode_documents(docs)
    assert split._split._pool is None
    assert split.encode_documents(docs) == expected
    assert split._split._pool is not None  # it did split: the runs after the first ran on its pool
    assert len(expected) == len(docs)
    # Below the split threshold (one call), and a single document.
    assert split.encode_documents(docs[: SPLIT_MIN_DOCUMENTS - 1]) == expected[: SPLIT_MIN_DOCUMENTS - 1]
    assert split.encode_documents(docs[5:6]) == expected[5:6]


@pytest.mark.parametrize(
    ("long_texts", "max_tokens", "max_chunks"),
    [
        (CHUNK, None, 10),
        (CHUNK, None, 2),
        (CHUNK, 40, 10),
        (LongTexts(mode="truncate", side="right"), None, 10),
        (LongTexts(mode="truncate", side="left"), None, 10),
        (LongTexts(mode="truncate", side="left"), 300, 10),
    ],
)
def test_the_same_jobs(model_dir: Path, long_texts: LongTexts, max_tokens: int | None, max_chunks: int) -> None:
    one, split = _tokenizer(model_dir, 1), _tokenizer(model_dir, 4)
    limits, docs = LimitsConfig(), _documents()

    async def job(tok: Any) -> Any:
        return await token_job(limits, tok, "which fox café?", "", docs, max_tokens, max_chunks, long_texts)

    (a, owners_a), (b, owners_b) = anyio.run(job, one), anyio.run(job, split)
    assert (b.shared_ids, list(b.item_ids), owners_b) == (a.shared_ids, list(a.item_ids), owners_a)
    assert max(map(len, a.item_ids)) <= one.item_room(a.shared_ids)
    assert len(a.item_ids) > len(docs) or long_texts.mode != "chunk" or max_tokens is not None  # long ones chunked


def test_a_refusal_is_the_same(model_dir: Path) -> None:
    reject = LongTexts(mode="reject")
    messages = []
    for threads in (1, 3):
        with pytest.raises(InputTooLongError) as err:
            anyio.run(
                token_job, LimitsConfig(), _tokenizer(model_dir, threads), "q", "", _documents(), None, 10, reject
            )
        messages.append(str(err.value))
    assert messages[0] == messages[1]


class _Enc:
    def __init__(self, text: str) -> None:
        self.ids = [len(text), ord(text[0]) if text else 0]


def test_runs_joined_in_document_order_and_errors_raised() -> None:
    seen: set[str] = set()

    def encode_batch(texts: list[str], add_special_tokens: bool) -> list[_Enc]:
        assert add_special_tokens is False
        seen.add(threading.current_thread().name)
        if "boom" in texts:
            raise ValueError("boom")
        return [_Enc(t) for t in texts]

    texts = [chr(65 + i % 26) * (1 + i % 9) for i in range(100)]
    enc = SplitEncoder(encode_batch, 4)
    assert enc(texts) == [_Enc(t).ids for t in texts]
    assert len(seen) > 1  # the caller's thread and the pool's
    with pytest.raises(ValueError, match="boom"):
        enc([*texts[:90], "boom", *texts[90:]])  # in a later run, on a pool thread


def test_split_bounds() -> None:
    for n, parts in [(24, 4), (100, 3), (5, 8), (30, 1)]:
        texts = [("x" * (1 + 37 * i % 50)) for i in range(n)]
        bounds = split_bounds(texts, parts)
        assert bounds[0] == 0 and bounds[-1] == n and len(bounds) == min(parts, n) + 1
        assert all(a < b for a, b in itertools.pairwise(bounds))  # no empty run
    # About equal characters: one long document up front is a run of its own.
    assert split_bounds(["x" * 300] + ["x"] * 30, 3)[1] == 1


def test_auto_is_a_quarter_of_the_cpus_at_most_4(monkeypatch: pytest.MonkeyPatch) -> None:
    for cpus, threads in [(1, 1), (2, 1), (7, 1), (8, 2), (16, 4), (128, 4)]:
        monkeypatch.setattr("os.sched_getaffinity", lambda _pid, n=cpus: set(range(n)))
        assert resolve_tokenize_threads("auto") == threads
    assert resolve_tokenize_threads(6) == 6
    assert TransformersEngineConfig(name="m").tokenize_threads == 1  # off by default: no gain on the H200


def test_a_busy_pool_means_one_call_on_the_callers_thread() -> None:
    """Under load the pool's threads are taken: a request encodes alone, as before, not queued behind them."""
    release, blocked = threading.Event(), threading.Event()
    threads_of: dict[str, set[str]] = {}

    def encode_batch(texts: list[str], add_special_tokens: bool) -> list[_Enc]:
        threads_of.setdefault(texts[0], set()).add(threading.current_thread().name)
        if "block" in texts:
            blocked.set()
            assert release.wait(10)
        return [_Enc(t) for t in texts]

    enc = SplitEncoder(encode_batch, 2)
    first = ["a"] * 30 + ["block"] * 30  # its second run takes the pool's one thread, and holds it
    holder = threading.Thread(target=enc, args=(first,), name="holder")
    holder.start()
    assert blocked.wait(10)
    second = ["z"] * 40
    assert enc(second) == [_Enc(t).ids for t in second]
    assert threads_of["z"] == {threading.current_thread().name}  # one call, here
    release.set()
    holder.join(10)
    assert enc._busy == 0  # every thread given back
    third = ["y"] * 40
    enc(third)
    assert len(threads_of["y"]) == 2  # free again: split
