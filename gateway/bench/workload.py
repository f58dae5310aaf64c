"""Benchmark workloads: deterministic rerank requests with lengths measured in tokens.

A length is ``N`` (fixed), ``A-B`` (uniform integer range) or comes from a file of texts. Text
is made of common English words; with a tokenizer (``tokenizer.json`` of the model under test)
every text is cut at the exact token count, without one each word counts as one token (common
English words are single tokens in Qwen's and GPT's vocabularies, so the estimate is close).
Every request gets a fresh query and fresh documents (seeded), so nothing but the template and
instruction repeats across requests -- the way real traffic shares prefixes. A duplicate share
copies some documents within a request, to exercise dedup.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import msgspec

__all__ = (
    "BenchRequest",
    "LengthSpec",
    "TokenCounter",
    "WordCounter",
    "WorkloadSpec",
    "build_workload",
    "load_texts",
    "load_token_counter",
)

_WORDS = (  # noqa: SIM905  # a few hundred words read better as one string than as a list literal
    "the of and to in is was for on that with as by at from his an were are which this be or has had "
    "not but first one their its new after who they have her she two been other when there all during "
    "into school time may years more most only over city some world would where later up such used "
    "many can state about national out known university united then made team american under game "
    "season also three high film well part both group john people while since this however around "
    "number series music family about through county center north south east west river water house "
    "country small large long short red blue green black white light dark cotton leather steel wood "
    "glass paper price sale shipping order return size color brand model phone laptop camera shoe "
    "shirt dress bag watch table chair lamp garden kitchen coffee tea bottle cable charger battery "
    "screen audio video power fast slow quality design style classic modern vintage premium basic "
    "women men kids baby sport outdoor travel home office gift pack set pair kit case cover stand "
    "search query answer document passage result rank score model data system network server client "
    "market policy health science history art book story report study value rate level area field"
).split()


class TokenCounter(Protocol):
    """Counts and cuts text in the tokens of the model under test."""

    exact: bool

    def count(self, texts: Sequence[str]) -> list[int]: ...

    def cut(self, text: str, tokens: int) -> str:
        """The longest prefix of ``text`` holding at most ``tokens`` tokens."""
        ...


class WordCounter:
    """One whitespace word = one token: an estimate, used when no tokenizer is given."""

    exact = False

    def count(self, texts: Sequence[str]) -> list[int]:
        return [len(t.split()) for t in texts]

    def cut(self, text: str, tokens: int) -> str:
        return " ".join(text.split()[:tokens])


class _HFTokenizerCounter:
    """Exact counts with the model's own ``tokenizer.json`` (Rust ``tokenizers``, batch-parallel)."""

    exact = True

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer  # the `transformers` / `bench` extra provides it

        self._tok = Tokenizer.from_file(str(path))

    def count(self, texts: Sequence[str]) -> list[int]:
        # Inside the Qwen3 prompt a document follows "<Document>:" with one space: count it so.
        return [len(e.ids) for e in self._tok.encode_batch([f" {t}" for t in texts], add_special_tokens=False)]

    def cut(self, text: str, tokens: int) -> str:
        enc = self._tok.encode(f" {text}", add_special_tokens=False)
        if len(enc.ids) <= tokens:
            return text
        end = enc.offsets[tokens - 1][1]
        return text[: max(0, end - 1)].rstrip()


def load_token_counter(path: str | None) -> TokenCounter:
    """A directory holding ``tokenizer.json`` (a model checkpoint) or the file itself; None: words."""
    if not path:
        return WordCounter()
    p = Path(path)
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise ValueError(f"no tokenizer.json at {path}")
    return _HFTokenizerCounter(p)


class LengthSpec(msgspec.Struct, frozen=True):
    """``N`` or ``A-B`` tokens."""

    low: int
    high: int

    @classmethod
    def parse(cls, text: str) -> LengthSpec:
        m = re.fullmatch(r"\s*(\d+)\s*(?:[-:]\s*(\d+)\s*)?", text)
        if not m:
            raise ValueError(f"length {text!r}: expected N or A-B (tokens)")
        low = int(m.group(1))
        high = int(m.group(2)) if m.group(2) else low
        if low < 1 or high < low:
            raise ValueError(f"length {text!r}: need 1 <= A <= B")
        return cls(low, high)

    def draw(self, rng: random.Random) -> int:
        return rng.randint(self.low, self.high)

    def __str__(self) -> str:
        return str(self.low) if self.low == self.high else f"U[{self.low},{self.high}]"


class WorkloadSpec(msgspec.Struct, kw_only=True, frozen=True):
    requests: int = 100
    documents: int = 100
    query_tokens: str = "10"
    doc_tokens: str = "50-150"
    duplicate_share: float = 0.0
    top_n: int | None = None
    instruction: str | None = None
    model: str | None = None
    seed: int = 0
    docs_file: str | None = None
    queries_file: str | None = None

    def describe(self) -> str:
        docs = f"texts from {self.docs_file}" if self.docs_file else f"{LengthSpec.parse(self.doc_tokens)} tokens"
        query = (
            f"texts from {self.queries_file}" if self.queries_file else f"{LengthSpec.parse(self.query_tokens)} tokens"
        )
        parts = [f"1 query ({query}) x {self.documents} documents ({docs})"]
        if self.duplicate_share:
            parts.append(f"{self.duplicate_share:.0%} duplicates")
        if self.top_n:
            parts.append(f"top_n={self.top_n}")
        parts.append("instruction: " + (repr(self.instruction) if self.instruction else "server default"))
        return ", ".join(parts)


class BenchRequest(msgspec.Struct, kw_only=True, frozen=True):
    """One prepared request: the JSON body is encoded once, before the clock starts."""

    body: bytes
    documents: int
    unique_documents: int
    query_tokens: int
    doc_tokens: int  # all documents together
    # Query tokens x documents + document tokens: what the model reads, template excluded.
    content_tokens: int
    expected_results: int


def load_texts(path: str) -> list[str]:
    """One text per line, or JSON lines with a ``text`` key; blank lines are skipped."""
    texts: list[str] = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("{"):
            value = json.loads(line).get("text")
            if isinstance(value, str) and value.strip():
                texts.append(value)
        else:
            texts.append(line)
    if not texts:
        raise ValueError(f"{path}: no texts")
    return texts


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n))


def _texts(rng: random.Random, n: int, length: LengthSpec, pool: list[str] | None, counter: TokenCounter) -> list[str]:
    if pool is not None:
        return [rng.choice(pool) for _ in range(n)]
    targets = [length.draw(rng) for _ in range(n)]
    # Each word is at least one token, so `target` words always hold enough tokens to cut.
    drafts = [_words(rng, t) for t in targets]
    if not counter.exact:
        return drafts
    return [counter.cut(d, t) for d, t in zip(drafts, targets, strict=True)]


def build_workload(spec: WorkloadSpec, counter: TokenCounter | None = None) -> list[BenchRequest]:
    """``spec.requests`` distinct requests (the same ones for the same seed)."""
    if spec.documents < 1 or spec.requests < 1:
        raise ValueError("requests and documents must be >= 1")
    if not 0.0 <= spec.duplicate_share < 1.0:
        raise ValueError("duplicate share must be in [0, 1)")
    counter = counter or WordCounter()
    rng = random.Random(spec.seed)
    doc_len, query_len = LengthSpec.parse(spec.doc_tokens), LengthSpec.parse(spec.query_tokens)
    doc_pool = load_texts(spec.docs_file) if spec.docs_file else None
    query_pool = load_texts(spec.queries_file) if spec.queries_file else None
    encoder = msgspec.json.Encoder()
    out: list[BenchRequest] = []
    for _ in range(spec.requests):
        query = _texts(rng, 1, query_len, query_pool, counter)[0]
        n_dup = min(spec.documents - 1, round(spec.duplicate_share * spec.documents))
        unique = _texts(rng, spec.documents - n_dup, doc_len, doc_pool, counter)
        docs = list(unique)
        for _ in range(n_dup):  # copies of earlier documents at random places
            docs.insert(rng.randrange(len(docs) + 1), rng.choice(unique))
        q_tokens = counter.count([query])[0]
        d_tokens = sum(counter.count(docs))
        body: dict[str, object] = {"query": query, "documents": docs}
        if spec.model:
            body["model"] = spec.model
        if spec.top_n:
            body["top_n"] = spec.top_n
        if spec.instruction:
            body["instruction"] = spec.instruction
        out.append(
            BenchRequest(
                body=encoder.encode(body),
                documents=len(docs),
                unique_documents=len(set(docs)),
                query_tokens=q_tokens,
                doc_tokens=d_tokens,
                content_tokens=q_tokens * len(docs) + d_tokens,
                expected_results=min(spec.top_n or len(docs), len(docs)),
            )
        )
    return out
