"""The ``rerank-gateway eval`` subcommand: read the judgements, build the candidates, rerank them
with every model, score and report.

``--help`` prints :data:`_DESCRIPTION` and :data:`_EXAMPLES` (written for people, not this docstring).
Every refusal is one line on stderr: exit 2 for input the command cannot use (a file, an
argument), 1 when the gateway did not answer as a run needs (unreachable, a model the key may not
use, a model not served).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import shlex
import sys
from pathlib import Path
from typing import Any

__all__ = ("add_parser", "run")

_DESCRIPTION = """\
Measure the ranking quality of the models a gateway serves on your own judgements (a BEIR
directory, or TREC qrels with a corpus and queries): nDCG@10, MRR@10 and Recall@k of each model
and of the first stage (a TREC run file, else BM25), with paired significance tests between
them, and the latency and documents/s of the same requests. Writes eval.json, report.md and a
quality-against-speed plot into --out.
"""

_EXAMPLES = """\
examples:
  rerank-gateway eval http://127.0.0.1:8000 ./scifact --model minilm --model bge-v2-m3
  rerank-gateway eval http://127.0.0.1:8000 --corpus corpus.jsonl --queries queries.jsonl \\
      --qrels qrels.trec --run bm25.run --depth 50 --model cascade,bge-v2-m3
"""


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text!r}")
    return value


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "eval",
        help="measure ranking quality (nDCG, MRR, Recall) of served models on your judgements",
        description=_DESCRIPTION,
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "url", help="the gateway (or any Cohere-compatible endpoint); a bare http://host:port gets /v2/rerank"
    )
    p.add_argument("data", nargs="?", help="a BEIR directory: corpus.jsonl, queries.jsonl, qrels/<split>.tsv")
    p.add_argument(
        "--model",
        action="append",
        required=True,
        help="a model to evaluate (repeat, or a comma-separated list; interleaved query by query)",
    )
    d = p.add_argument_group("judgements and candidates")
    d.add_argument("--split", default="test", help="the BEIR qrels split (default test)")
    d.add_argument("--corpus", help="instead of a BEIR directory: corpus.jsonl (BEIR's _id, title, text)")
    d.add_argument("--queries", help="... queries.jsonl (_id, text)")
    d.add_argument("--qrels", help="... qrels: BEIR TSV or TREC 'qid iter docid grade'")
    d.add_argument("--run", help="candidates from this TREC run file ('qid Q0 docid rank score tag'); default BM25")
    d.add_argument("--depth", type=_positive, default=100, help="candidates reranked per query (default 100)")
    d.add_argument("--max-queries", type=_positive, help="only the first N judged queries")
    m = p.add_argument_group("metrics")
    m.add_argument("--recall-at", type=_ints, default=[10, 100], help="Recall cut-offs (default 10,100)")
    m.add_argument(
        "--test",
        choices=("student", "fisher"),
        default="student",
        help="paired significance test: Student's t (default) or Fisher's randomization test",
    )
    m.add_argument("--max-p", type=float, default=0.05, help="p-value at or below which a difference is significant")
    e = p.add_argument_group("endpoint")
    e.add_argument("--api-key", help="sent as Authorization: Bearer KEY (never written to the reports)")
    e.add_argument("--api-key-file", metavar="PATH", help="read the key from this file instead (argv shows in ps)")
    e.add_argument("--header", action="append", default=[], help="extra header 'Name: value' (repeatable)")
    e.add_argument("--timeout", type=float, default=120.0, help="seconds per request (default 120)")
    e.add_argument("--warmup", type=int, default=1, help="queries sent to each model first, unmeasured (default 1)")
    o = p.add_argument_group("output")
    o.add_argument("--out", help="output folder (default eval-out/<UTC time>)")
    o.add_argument("--title", default="Ranking quality", help="report title")
    o.add_argument("--no-plot", action="store_true", help="skip the PNG plot (no matplotlib needed)")
    o.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)
    return p


def _judgements(args: argparse.Namespace) -> Any:
    from adapters.runtimes.judgements import load_beir, load_files

    files = (args.corpus, args.queries, args.qrels)
    if args.data and any(files):
        raise ValueError("give a BEIR directory or --corpus/--queries/--qrels, not both")
    if args.data:
        return load_beir(args.data, args.split)
    if not all(files):
        raise ValueError("give a BEIR directory, or all of --corpus, --queries and --qrels")
    return load_files(*files)


def _models(given: list[str]) -> list[str]:
    models = [name.strip() for item in given for name in item.split(",") if name.strip()]
    if not models:
        raise ValueError("--model: no model named")
    if len(set(models)) != len(models):
        raise ValueError(f"--model: a model is named twice ({', '.join(models)})")
    return models


def run(args: argparse.Namespace, argv: list[str] | None = None) -> int:
    from adapters.runtimes.judgements import JudgementError
    from gateway.bench.command import _endpoint_url, _headers
    from gateway.bench.redact import Redactor

    redactor = Redactor(keys=(args.api_key,), headers=args.header, urls=(args.url,))

    def fail(message: str, code: int) -> int:
        print(redactor.scrub(f"rerank-gateway eval: {message}"), file=sys.stderr)
        return code

    try:
        if args.api_key_file:
            args.api_key = Path(args.api_key_file).read_text(encoding="utf-8").strip()
            redactor = Redactor(keys=(args.api_key,), headers=args.header, urls=(args.url,))
        url = _endpoint_url(args.url)
        headers = _headers(args.header, args.api_key)
        models = _models(args.model)
        judgements = _judgements(args)
        queries, candidates, first_stage = _candidates(args, judgements)
        out_dir = Path(args.out or f"eval-out/{dt.datetime.now(dt.UTC).strftime('%Y%m%d-%H%M%S')}")
        out_dir.mkdir(parents=True, exist_ok=True)
    except (ValueError, OSError) as exc:  # JudgementError is a ValueError
        what = exc if isinstance(exc, ValueError | JudgementError) else f"{exc.strerror or exc}: {exc.filename}"
        return fail(str(what), 2)
    except ImportError as exc:
        return fail(f"{exc.name or exc} is not installed: pip install 'rerank-gateway[eval]'", 2)
    load_before = os.getloadavg()
    try:
        answers = _drive(args, url, headers, models, queries)
    except _Stop as stop:
        return fail(str(stop), 1)
    load_after = os.getloadavg()
    return _report(
        args,
        argv,
        redactor,
        judgements,
        first_stage,
        candidates,
        answers,
        models,
        out_dir,
        load=(load_before, load_after),
        url=url,
    )


class _Stop(Exception):
    pass


def _candidates(args: argparse.Namespace, judgements: Any) -> tuple[list[Any], dict[str, list[str]], str]:
    from adapters.runtimes.judgements import read_run
    from gateway.eval.driver import Query
    from gateway.eval.first_stage import bm25_run, top

    if args.run:
        first, name = read_run(args.run, judgements), f"run file {Path(args.run).name}"
    else:
        first, name = bm25_run(judgements, args.depth), "BM25 (bm25s)"
    qids = list(judgements.queries)[: args.max_queries]
    ranked = top(first, args.depth)
    candidates = {q: [d for d, _ in ranked.get(q, [])] for q in qids}
    queries = [
        Query(
            qid=q,
            text=judgements.queries[q],
            doc_ids=candidates[q],
            texts=[judgements.corpus[d] for d in candidates[q]],
        )
        for q in qids
        if candidates[q]
    ]
    if not queries:
        raise ValueError("the first stage found no candidates for any judged query")
    return queries, candidates, name


def _drive(args: argparse.Namespace, url: str, headers: dict[str, str], models: list[str], queries: list[Any]) -> Any:
    from gateway.eval.driver import EvalError, run_models

    bar = None
    if not args.no_progress:
        from tqdm import tqdm

        bar = tqdm(total=len(queries) * len(models), unit="req", desc="eval", file=sys.stderr)
    try:
        return asyncio.run(
            run_models(
                url,
                headers,
                models,
                queries,
                timeout=args.timeout,
                warmup=max(0, args.warmup),
                progress=(lambda _: bar.update(1)) if bar is not None else None,
            )
        )
    except EvalError as exc:
        raise _Stop(str(exc)) from None
    finally:
        if bar is not None:
            bar.close()


def _report(
    args: argparse.Namespace,
    argv: list[str] | None,
    redactor: Any,
    judgements: Any,
    first_stage: str,
    candidates: dict[str, list[str]],
    answers: dict[str, list[Any]],
    models: list[str],
    out_dir: Path,
    *,
    load: tuple[tuple[float, ...], tuple[float, ...]],
    url: str,
) -> int:
    from gateway.bench.report import environment, write_json
    from gateway.eval.metrics import metric_names, score_systems
    from gateway.eval.report import FIRST_STAGE, speed, write_markdown, write_plot

    metrics = metric_names(args.recall_at)
    qids = list(candidates)
    orders = {FIRST_STAGE: candidates}
    for model in models:
        by_query = {a.qid: a.order for a in answers[model]}
        orders[model] = {q: by_query.get(q, []) for q in qids}
    qrels = {q: judgements.qrels[q] for q in qids}
    quality = score_systems(qrels, orders, metrics, stat_test=args.test, max_p=args.max_p)
    per_query = {q: {name: {m: quality["per_query"][name][m][q] for m in metrics} for name in orders} for q in qids}
    for model in models:
        for a in answers[model]:
            per_query[a.qid][model]["latency_ms"] = round(a.latency_s * 1e3, 3)
    command = "rerank-gateway eval " + shlex.join(
        redactor.argv(argv if argv is not None else getattr(args, "argv", sys.argv[2:]))
    )
    doc: dict[str, Any] = {
        "tool": "rerank-gateway eval",
        "command": command,
        "environment": environment(),
        "load_average": " / ".join(f"{x:.2f}" for x in load[0]) + " (1 / 5 / 15 min)",
        "load_average_end": " / ".join(f"{x:.2f}" for x in load[1]),
        "endpoint": redactor.url(url),
        "data": {
            "source": judgements.source,
            "queries": len(qids),
            "documents": len(judgements.corpus),
            "judgements": sum(len(qrels[q]) for q in qids),
            "first_stage": first_stage,
            "depth": args.depth,
        },
        "metrics": metrics,
        "models": models,
        "quality": {k: quality[k] for k in ("mean", "tests", "stat_test", "max_p")},
        "speed": {model: speed(answers[model]) for model in models},
        "per_query": per_query,
        "plots": [],
    }
    doc = redactor.scrub_tree(doc)
    write_json(out_dir / "eval.json", doc)
    write_markdown(out_dir / "report.md", doc, title=args.title)
    if not args.no_plot:
        try:
            doc["plots"] = write_plot(out_dir, doc)
        except ImportError:
            print("plot skipped: matplotlib is not installed (pip install 'rerank-gateway[eval]')", file=sys.stderr)
        if doc["plots"]:
            write_json(out_dir / "eval.json", doc)
            write_markdown(out_dir / "report.md", doc, title=args.title)
    print((out_dir / "report.md").read_text(encoding="utf-8"))
    print(f"wrote {out_dir}/eval.json, report.md" + "".join(f", {p}" for p in doc["plots"]))
    return 0
