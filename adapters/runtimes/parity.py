"""The parity gate of reduced precisions: does a cheaper precision keep the model's ranking?

Shared by the runtimes that offer one: OpenVINO's bf16 / int8 against fp32
(``adapters.runtimes.cpu.start``), the packed engine's FP8 against bf16
(``adapters.runtimes.packed.gate``) and the transformers engine's bf16 / fp16 on CPU against
fp32 (``adapters.runtimes.transformers``). At start the engine scores a golden set (queries x
documents) in the reference precision and in the reduced one, through the same tokenization and
score rule requests take. A query keeps its ranking when the reduced precision's top-10 holds the
same documents in the same order as the reference's, swaps of two documents whose reference
scores differ by less than ``tie`` aside (documents the model itself cannot tell apart): every
pair the two orders rank differently, one of them in either top-10, must be such a pair. The
precision is admitted when at least ``min_agreement`` of the queries keep it; otherwise the model
refuses to start with one line saying what was measured.

The golden set is a JSON Lines file of real queries when configured (``parity_set``), else
generated: for OpenVINO from the tokenizer's own vocabulary (short queries of whole words and
documents of 40-110 words into which 0-5 of the query's words are mixed, so a trained reranker's
scores spread over its range as they do on real traffic); for the others graded one by one
(``graded_golden_set``). Deterministic (fixed seed): the same model gets the same verdict every
start.

Scored the same way on every start, too: the passes run in a fixed order, in batches planned
from the configuration alone (never from other traffic: the gate runs before the model serves),
and -- for the torch runtimes -- on a fixed number of intra-op threads (:func:`fixed_threads`: the
cores this process may run on), whatever other code left ``torch.set_num_threads`` at and
whatever else the machine is doing. A reduction split over another number of threads sums in
another order, and near the default tie a last-bit change can move a verdict; OpenVINO's
plugin gets its thread count from the configuration already (``threads``, else the cores).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adapters.base import EngineConfigError
from schemas.config import PARITY_TOP_K

__all__ = (
    "DOC_WORDS",
    "GRADES",
    "GoldenQuery",
    "ParityReport",
    "compare_rankings",
    "fixed_threads",
    "gate_threads",
    "generate_golden_set",
    "golden_set_or_refuse",
    "graded_golden_set",
    "read_golden_set",
)

TOP_K = PARITY_TOP_K


@dataclass(frozen=True)
class GoldenQuery:
    query: str
    documents: list[str]


@dataclass(frozen=True)
class ParityReport:
    queries: int
    kept: int  # queries whose top-10 the reduced precision keeps
    mean_shared: float  # documents of the reference's top-10 also in the reduced top-10, on average
    max_delta: float  # largest |score change| over all pairs

    @property
    def agreement(self) -> float:
        return self.kept / self.queries if self.queries else 1.0

    def line(self, precision: str, reference: str = "fp32") -> str:
        return (
            f"precision {precision!r} keeps the {reference} top-{TOP_K} order of {self.kept} of {self.queries} "
            f"golden queries ({self.agreement:.1%}), {self.mean_shared:.1f} of {TOP_K} top documents shared "
            f"on average, largest score change {self.max_delta:.1e}"
        )


def _words(vocab: dict[str, int]) -> list[str]:
    """Whole-word tokens of a vocabulary (WordPiece, SentencePiece '▁' and byte-level 'Ġ' styles)."""
    out = set()
    for token in vocab:
        word = token.lstrip("▁Ġ")
        if len(word) >= 3 and word.isalpha() and word.isascii():
            out.add(word.lower())
    return sorted(out)


def generate_golden_set(vocab: dict[str, int], *, queries: int, documents: int, seed: int = 20) -> list[GoldenQuery]:
    """``queries`` x ``documents`` texts made of the tokenizer's own words (see the module doc)."""
    words = _words(vocab)
    rng = random.Random(seed)
    if len(words) < 20:
        # A small subword vocabulary (test models): words glued from its alphabetic pieces.
        stripped = (t.lstrip("▁Ġ#") for t in vocab)
        pieces = sorted({p for p in stripped if p.isalpha() and p.isascii()})
        if len(pieces) < 20:
            raise ValueError(
                f"the tokenizer has only {len(pieces)} alphabetic tokens; set parity_set to a file of real queries"
            )
        words = sorted({"".join(rng.choices(pieces, k=rng.randint(2, 3))) for _ in range(500)})
    out = []
    for _ in range(queries):
        query_words = rng.sample(words, k=rng.randint(3, 6))
        docs = []
        for _ in range(documents):
            body = rng.choices(words, k=rng.randint(40, 110))
            for _ in range(rng.randint(0, 5)):  # relevance: how many query words the document mentions
                body.insert(rng.randrange(len(body) + 1), rng.choice(query_words))
            docs.append(" ".join(body))
        out.append(GoldenQuery(" ".join(query_words), docs))
    return out


# The graded set (packed FP8, transformers bf16 / fp16 on CPU): whole English words that every
# tokenizer spells, so it needs no vocabulary (a listwise model exposes none).
GRADES = TOP_K  # query words, so that the top 10 hold 10, 9, ... 1 of them
DOC_WORDS = 30  # every document's length: relevance is density, not length
_WORDS = """apple river mountain engine battery protein galaxy violin harbor glacier copper wheat
tunnel orbit fever castle bridge desert forest lantern market pepper rocket saddle turbine volcano
whale yogurt zinc anchor basket canyon dolphin eclipse falcon garlic hammer island jungle kettle
lemon magnet needle oyster parrot quartz rabbit salmon tomato umbrella velvet walnut lizard
algebra ballot climate diesel enzyme fossil genome harvest insulin justice kernel lattice mortgage
neuron ozone pension quantum reactor satellite tariff uranium vaccine warranty yeast zoning
printer router compiler database firewall laptop monitor network password server keyboard""".split()  # noqa: SIM905  # prose reads better


def graded_golden_set(*, queries: int, documents: int, seed: int = 24) -> list[GoldenQuery]:
    """``queries`` queries of ``GRADES`` words; document j holds ``max(0, GRADES - j)`` of them
    among ``DOC_WORDS`` words, so a trained reranker's top 10 differ in relevance one by one
    instead of tying (a set whose top 10 share as many query words makes a gate measure the
    order of equals). The first n queries are the same for any ``queries`` >= n."""
    rng = random.Random(seed)
    out = []
    for _ in range(queries):
        topic = rng.sample(_WORDS, GRADES)
        query = f"which documents mention {', '.join(topic[:-1])} and {topic[-1]}?"
        others = [w for w in _WORDS if w not in topic]
        docs = []
        for j in range(documents):
            shared = rng.sample(topic, max(0, GRADES - j))
            words = shared + rng.sample(others, DOC_WORDS - len(shared))
            rng.shuffle(words)
            docs.append(" ".join(words) + ".")
        out.append(GoldenQuery(query, docs))
    return out


def read_golden_set(path: str | Path) -> list[GoldenQuery]:
    """A JSON Lines file of ``{"query": str, "documents": [str, ...]}`` (at least 10 documents each).

    Every problem is a one-line ValueError naming the file (and line): the engines refuse the
    model with it, and ``check-config`` reports it before anything loads."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ValueError(f"{path}: cannot be read as UTF-8 text ({why})") from None
    out = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item: Any = json.loads(line)
            query, docs = item["query"], item["documents"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f'{path}:{n}: expected {{"query": ..., "documents": [...]}}') from exc
        if not isinstance(query, str) or not isinstance(docs, list) or not all(isinstance(d, str) for d in docs):
            raise ValueError(f"{path}:{n}: query must be a string and documents a list of strings")
        if len(docs) < TOP_K:
            raise ValueError(
                f"{path}:{n}: {len(docs)} documents; the gate compares top-{TOP_K}, so give at least {TOP_K}"
            )
        out.append(GoldenQuery(query, list(docs)))
    if not out:
        raise ValueError(f"{path}: no queries")
    return out


def golden_set_or_refuse(
    model: str, parity_set: str | None, generate: Callable[[], list[GoldenQuery]]
) -> list[GoldenQuery]:
    """The operator's ``parity_set``, else ``generate()``. Engines call it before loading any
    weights: a bad file is the model's one-line refusal (the line ``check-config`` prints)."""
    if parity_set is None:
        return generate()
    try:
        return read_golden_set(parity_set)
    except ValueError as exc:
        raise EngineConfigError(f"model {model!r}: parity_set: {exc}") from None


def _order(scores: Sequence[float]) -> list[int]:
    # Stable: equal scores keep input order, as the gateway's own sort does.
    return sorted(range(len(scores)), key=lambda i: -scores[i])


def keeps_top_k(reference: Sequence[float], reduced: Sequence[float], *, tie: float, k: int = TOP_K) -> bool:
    """Whether ``reduced`` ranks the top-``k`` as ``reference`` does: every pair of documents that
    the two orders put differently, one of them in either top-``k``, is a pair whose reference
    scores differ by less than ``tie``. Pairs, not positions: comparing the documents at each
    position would let a document sink through a run of near-ties (each neighbour within ``tie``
    of the next) out of the top-``k``. A NaN where the reference has a number is a change: sorting
    by a NaN key leaves a document where it was, so the order alone would look kept."""
    if any(math.isnan(b) and not math.isnan(a) for a, b in zip(reference, reduced, strict=True)):
        return False
    ref, red = _order(reference), _order(reduced)
    ref_rank = {d: i for i, d in enumerate(ref)}
    red_rank = {d: i for i, d in enumerate(red)}
    for x in set(ref[:k]) | set(red[:k]):
        for y in ref:
            moved = (ref_rank[x] < ref_rank[y]) != (red_rank[x] < red_rank[y])
            if moved and abs(reference[x] - reference[y]) >= tie:
                return False
    return True


def compare_rankings(
    reference: Sequence[Sequence[float]], reduced: Sequence[Sequence[float]], *, tie: float
) -> ParityReport:
    """Compare per-query scores of the reference precision (fp32, or bf16 for FP8) and a reduced one."""
    kept, shared, delta = 0, 0, 0.0
    for ref, red in zip(reference, reduced, strict=True):
        kept += keeps_top_k(ref, red, tie=tie)
        shared += len(set(_order(ref)[:TOP_K]) & set(_order(red)[:TOP_K]))
        delta = max(delta, max((_change(a, b) for a, b in zip(ref, red, strict=True)), default=0.0))
    n = len(reference)
    return ParityReport(queries=n, kept=kept, mean_shared=shared / n if n else float(TOP_K), max_delta=delta)


def _change(a: float, b: float) -> float:
    """|a - b|; infinite where one side is NaN (max() would skip it)."""
    d = abs(a - b)
    return math.inf if math.isnan(d) else d


# One gate at a time sets the threads: two engines starting side by side in one process must not
# change each other's count in the middle of a pass.
_THREADS_LOCK = threading.Lock()


def gate_threads() -> int:
    """The intra-op threads every gate scores with: the cores this process may run on. Fixed for a
    machine and container; not torch's current setting, which is process state (what a test, an
    engine or an earlier start left behind)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@contextlib.contextmanager
def fixed_threads() -> Iterator[int]:
    """torch's intra-op threads set to :func:`gate_threads` for the gate's passes (both of them:
    the reference and the reduced precision), then restored; yields the count. ``set_num_threads``
    is called from the thread that scores, which is what OpenMP's per-thread setting needs."""
    import torch

    with _THREADS_LOCK:
        before = torch.get_num_threads()
        n = gate_threads()
        torch.set_num_threads(n)
        try:
            yield n
        finally:
            torch.set_num_threads(before)
