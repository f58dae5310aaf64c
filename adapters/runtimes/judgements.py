"""Relevance judgements in the formats people already have: a BEIR directory (``corpus.jsonl``,
``queries.jsonl``, ``qrels/<split>.tsv``) or TREC files (qrels ``qid iter docid grade``, runs
``qid Q0 docid rank score tag``).

Read by ``rerank-gateway eval`` (``gateway.eval``) and by the qrels precision gate
(``adapters.runtimes.qrels_gate``), so both take the same files with the same checks. It lives
here, below both, because the gate runs inside an engine and ``adapters`` never imports
``gateway``. Standard library only.

Every problem is one :class:`JudgementError` line naming the file and line (a qrels naming a
document the corpus lacks, a judged query that is empty, a line that does not parse): the eval
command prints it and exits, the gate refuses the model with it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ("JudgementError", "Judgements", "load_beir", "load_files", "read_run")


class JudgementError(ValueError):
    """A judgement, query, corpus or run file that cannot be used; the message is one line."""


@dataclass(frozen=True)
class Judgements:
    corpus: dict[str, str]  # document id -> text (BEIR: title and text joined by a space)
    queries: dict[str, str]  # query id -> text, only the queries the qrels judge
    qrels: dict[str, dict[str, int]]  # query id -> document id -> grade (0: judged not relevant)
    source: str  # what was read, for reports


def _jsonl(path: Path) -> list[tuple[int, dict[str, Any]]]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise JudgementError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise JudgementError(f"{path}: cannot be read as UTF-8 text ({why})") from None
    out = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError:
            raise JudgementError(f"{path}:{n}: not a JSON object") from None
        if not isinstance(item, dict) or not isinstance(item.get("_id"), str | int):
            raise JudgementError(f'{path}:{n}: expected an object with an "_id" (BEIR layout)')
        out.append((n, item))
    return out


def read_corpus(path: Path) -> dict[str, str]:
    corpus: dict[str, str] = {}
    for n, item in _jsonl(path):
        title, text = item.get("title") or "", item.get("text")
        if not isinstance(text, str) or not isinstance(title, str):
            raise JudgementError(f'{path}:{n}: "text" (and "title", if any) must be strings')
        corpus[str(item["_id"])] = f"{title} {text}".strip() if title else text
    if not corpus:
        raise JudgementError(f"{path}: no documents")
    return corpus


def _read_queries(path: Path) -> dict[str, tuple[int, str]]:
    queries: dict[str, tuple[int, str]] = {}
    for n, item in _jsonl(path):
        text = item.get("text")
        if not isinstance(text, str):
            raise JudgementError(f'{path}:{n}: "text" must be a string')
        queries[str(item["_id"])] = (n, text)
    return queries


def read_qrels(path: Path) -> list[tuple[int, str, str, int]]:
    """(line, query id, document id, grade) of a BEIR TSV (``query-id corpus-id score``, a header
    line) or a TREC qrels file (``qid iter docid grade``), told apart by their columns."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise JudgementError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise JudgementError(f"{path}: cannot be read as UTF-8 text ({type(exc).__name__})") from None
    out = []
    for n, line in enumerate(lines, start=1):
        cols = line.split()
        if not cols:
            continue
        if n == 1 and cols[-1].lower() in ("score", "relevance", "grade", "label"):
            continue  # BEIR's header line
        if len(cols) == 3:
            qid, did, grade = cols
        elif len(cols) == 4:
            qid, _, did, grade = cols
        else:
            raise JudgementError(
                f"{path}:{n}: expected 'query-id corpus-id grade' (BEIR) or "
                f"'qid iter docid grade' (TREC), got {len(cols)} columns"
            )
        try:
            value = int(grade)
        except ValueError:
            raise JudgementError(f"{path}:{n}: grade {grade!r} is not an integer") from None
        out.append((n, qid, did, value))
    if not out:
        raise JudgementError(f"{path}: no judgements")
    return out


def load_files(corpus_path: str | Path, queries_path: str | Path, qrels_path: str | Path) -> Judgements:
    """Corpus, queries and qrels files, checked against each other (see the module doc)."""
    corpus_p, queries_p, qrels_p = Path(corpus_path), Path(queries_path), Path(qrels_path)
    corpus = read_corpus(corpus_p)
    all_queries = _read_queries(queries_p)
    qrels: dict[str, dict[str, int]] = {}
    for n, qid, did, grade in read_qrels(qrels_p):
        if qid not in all_queries:
            raise JudgementError(f"{qrels_p}:{n}: query {qid!r} is not in {queries_p.name}")
        if did not in corpus:
            raise JudgementError(f"{qrels_p}:{n}: document {did!r} is not in {corpus_p.name}")
        qrels.setdefault(qid, {})[did] = grade
    queries = {}
    for qid in qrels:
        line, text = all_queries[qid]
        if not text.strip():
            raise JudgementError(f"{queries_p}:{line}: query {qid!r} is empty (it is judged in {qrels_p.name})")
        queries[qid] = text
    return Judgements(corpus=corpus, queries=queries, qrels=qrels, source=f"{corpus_p.parent}")


def load_beir(directory: str | Path, split: str = "test") -> Judgements:
    """A BEIR dataset directory: ``corpus.jsonl``, ``queries.jsonl`` and ``qrels/<split>.tsv``."""
    root = Path(directory)
    if not root.is_dir():
        raise JudgementError(f"{root}: not a directory (expected BEIR's corpus.jsonl, queries.jsonl, qrels/)")
    qrels = root / "qrels" / f"{split}.tsv"
    if not qrels.is_file():
        have = sorted(p.stem for p in (root / "qrels").glob("*.tsv")) if (root / "qrels").is_dir() else []
        raise JudgementError(f"{qrels}: no such file" + (f"; splits here: {', '.join(have)}" if have else ""))
    out = load_files(root / "corpus.jsonl", root / "queries.jsonl", qrels)
    return Judgements(corpus=out.corpus, queries=out.queries, qrels=out.qrels, source=f"{root} ({split})")


def read_run(path: str | Path, judgements: Judgements) -> dict[str, dict[str, float]]:
    """A TREC run (``qid Q0 docid rank score tag``): query id -> document id -> score, for the
    judged queries; a document the corpus lacks is refused (it could not be sent for reranking)."""
    run_p = Path(path)
    try:
        lines = run_p.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise JudgementError(f"{run_p}: cannot be read ({exc.strerror or type(exc).__name__})") from None
    run: dict[str, dict[str, float]] = {}
    for n, line in enumerate(lines, start=1):
        cols = line.split()
        if not cols:
            continue
        if len(cols) != 6:
            raise JudgementError(
                f"{run_p}:{n}: expected 'qid Q0 docid rank score tag' (TREC run), got {len(cols)} columns"
            )
        qid, _, did, _, score, _ = cols
        try:
            value = float(score)
        except ValueError:
            raise JudgementError(f"{run_p}:{n}: score {score!r} is not a number") from None
        if qid not in judgements.qrels:
            continue
        if did not in judgements.corpus:
            raise JudgementError(f"{run_p}:{n}: document {did!r} is not in the corpus")
        run.setdefault(qid, {})[did] = value
    if not run:
        raise JudgementError(f"{run_p}: no line names a judged query")
    return run
