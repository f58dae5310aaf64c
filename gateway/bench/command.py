"""The ``rerank-gateway bench`` subcommand: parse, build the workload, drive, report.

``--help`` prints :data:`_DESCRIPTION` and :data:`_EXAMPLES` (written for people, not this docstring).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import msgspec

__all__ = ("add_parser", "run")


def _endpoint_url(url: str) -> str:
    """A bare base URL gets ``/v2/rerank``; a URL with a path is used as given."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"not an http(s) URL: {url!r}")
    try:
        parts.port  # noqa: B018 -- raises for a port outside 0-65535, which httpx would not catch
    except ValueError:
        raise ValueError(f"bad port in URL {url!r}: it must be 0-65535") from None
    return url.rstrip("/") + "/v2/rerank" if parts.path in ("", "/") else url


def _model_required(url: str, model: str | None, flag: str) -> None:
    """Cohere v2 requires ``model``: without it every request is a 422, so refuse before sending."""
    if model is None and urlsplit(url).path.rstrip("/").endswith("/v2/rerank"):
        raise ValueError(
            f"{url} is a Cohere v2 endpoint, which requires a model in every request: add {flag} NAME "
            "(the gateway lists its names at GET /v1/models)"
        )


def _numbers(text: str, kind: type) -> list[Any]:
    try:
        values = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of numbers, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive numbers, got {text!r}")
    return values


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:  # --max-in-flight 0: a semaphore that never admits a request, a hang
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text!r}")
    return value


_DESCRIPTION = """\
Measure a Cohere/Jina-compatible rerank endpoint (this gateway, LiteLLM, vllm serve, ...):
latency percentiles, throughput and errors per load level, written as a JSON + Markdown report
(and PNG plots) into --out. With --compare, two endpoints take turns round by round and the
report gives their ratios.
"""

_EXAMPLES = """\
examples:
  rerank-gateway bench http://127.0.0.1:8000 --model qwen3-reranker-0.6b \\
      --requests 200 --concurrency 1,4,16 --documents 100 --doc-tokens 50-150
  rerank-gateway bench http://127.0.0.1:8000/v2/rerank --model qwen3-reranker-0.6b --rate 20 --requests 400
  rerank-gateway bench http://127.0.0.1:8000 --model qwen3-reranker-0.6b --compare http://127.0.0.1:4000/rerank
"""


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "bench",
        help="benchmark a Cohere/Jina-compatible rerank endpoint (ours, LiteLLM, vllm serve, ...)",
        description=_DESCRIPTION,
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("url", help="endpoint URL; a bare http://host:port gets /v2/rerank")
    p.add_argument("--model", help="model name sent in every request")
    load = p.add_argument_group("load")
    load.add_argument("--requests", type=int, default=100, help="measured requests per load level (default 100)")
    load.add_argument(
        "--concurrency",
        default=[1],
        type=lambda t: _numbers(t, int),
        help="closed loop: concurrent clients, a list sweeps (e.g. 1,4,16; default 1)",
    )
    load.add_argument(
        "--rate", type=lambda t: _numbers(t, float), help="open loop instead: requests per second, a list sweeps"
    )
    load.add_argument("--poisson", action="store_true", help="open loop: Poisson arrivals instead of fixed spacing")
    load.add_argument(
        "--max-in-flight", type=_positive_int, default=1024, help="open loop: cap on outstanding requests"
    )
    load.add_argument("--warmup", type=int, default=2, help="unmeasured requests before each level (default 2)")
    load.add_argument("--timeout", type=float, default=120.0, help="seconds per request (default 120)")
    wl = p.add_argument_group("workload")
    wl.add_argument("--documents", type=int, default=100, help="documents per request (default 100)")
    wl.add_argument("--doc-tokens", default="50-150", help="document length: N or A-B tokens (default 50-150)")
    wl.add_argument("--query-tokens", default="10", help="query length: N or A-B tokens (default 10)")
    wl.add_argument("--docs-file", help="sample documents from this file (one per line, or JSONL with 'text')")
    wl.add_argument("--queries-file", help="sample queries from this file")
    wl.add_argument("--duplicates", type=float, default=0.0, help="share of duplicate documents per request (0-1)")
    wl.add_argument("--top-n", type=int, help="top_n sent in every request")
    wl.add_argument("--instruction", help="instruction sent in every request (default: the server's)")
    wl.add_argument("--tokenizer", help="model dir or tokenizer.json: exact token lengths (else 1 word = 1 token)")
    wl.add_argument(
        "--seed",
        type=int,
        default=0,
        help="random seed of the texts (and of --poisson arrivals): the same seed, the same run (default 0)",
    )
    auth = p.add_argument_group("endpoints")
    auth.add_argument("--api-key", help="sent as Authorization: Bearer KEY (never written to the reports)")
    auth.add_argument(
        "--api-key-file",
        metavar="PATH",
        help="read the key from this file instead (argv is visible to other users in ps)",
    )
    auth.add_argument("--header", action="append", default=[], help="extra header 'Name: value' (repeatable)")
    auth.add_argument("--label", help="name of the endpoint in reports (default: host:port)")
    auth.add_argument(
        "--compare", metavar="URL", help="alternate with this endpoint, round by round, and report ratios"
    )
    auth.add_argument("--compare-model", help="model name for the --compare endpoint (default: --model)")
    auth.add_argument(
        "--compare-api-key", help="API key for the --compare endpoint (default: none; never written to the reports)"
    )
    auth.add_argument(
        "--compare-api-key-file", metavar="PATH", help="read the --compare endpoint's key from this file instead"
    )
    auth.add_argument("--compare-label", help="name of the --compare endpoint in reports (default: host:port)")
    auth.add_argument("--round-size", type=int, help="--compare: requests per round (default: the concurrency)")
    out = p.add_argument_group("output")
    out.add_argument("--out", help="output folder (default bench-out/<UTC time>)")
    out.add_argument("--title", default="Rerank benchmark", help="report title")
    out.add_argument("--no-plot", action="store_true", help="skip the PNG plots (no matplotlib needed)")
    out.add_argument("--no-progress", action="store_true", help="no progress bar")
    out.add_argument("--strict", action="store_true", help="exit 1 if any request failed (default: only if all did)")
    p.set_defaults(func=run)
    return p


def _headers(raw: list[str], api_key: str | None) -> dict[str, str]:
    headers = {}
    for item in raw:
        name, sep, value = item.partition(":")
        if not sep or not name.strip():
            raise ValueError(f"--header {item!r}: expected 'Name: value'")
        headers[name.strip()] = value.strip()
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def _label(url: str, given: str | None) -> str:
    # netloc without user info: https://user:TOKEN@host must not name the endpoint in reports.
    return given or urlsplit(url).netloc.rpartition("@")[2]


# Level i > 0 draws its texts with seed + i x this: a level never re-sends an earlier level's
# bodies (a server's prefix or response cache would answer them), and level 0 is what it was.
LEVEL_SEED_STEP = 7919


def _level(ep: Any, levels: list[list[Any]], i: int) -> Any:
    import msgspec

    return msgspec.structs.replace(ep, requests=levels[i])


async def _drive(
    args: argparse.Namespace, endpoints: list[Any], progress: Any, levels: list[list[list[Any]]]
) -> tuple[list[Any], list[dict[str, Any]]]:
    """``levels[e][i]``: endpoint ``e``'s requests at load level ``i`` (fresh texts per level)."""
    from gateway.bench.driver import run_closed, run_compare, run_open
    from gateway.bench.report import ratios, summarize

    runs, comparisons = [], []
    if args.compare:
        for i, c in enumerate(args.concurrency):
            a, b = (_level(ep, levels[e], i) for e, ep in enumerate(endpoints))
            size = args.round_size or c
            ra, rb = await run_compare(
                a, b, concurrency=c, total=args.requests, round_size=size, timeout=args.timeout, progress=progress
            )
            runs += [ra, rb]
            sa, sb = summarize(ra), summarize(rb)
            comparisons.append(
                {
                    "a": a.label,
                    "b": b.label,
                    "concurrency": c,
                    "round_size": size,
                    "ratios": ratios(sa, sb),
                    "failed": [sa["failed"], sb["failed"]],
                }
            )
        return runs, comparisons
    if args.rate:
        for i, r in enumerate(args.rate):
            runs.append(
                await run_open(
                    _level(endpoints[0], levels[0], i),
                    rate=r,
                    total=args.requests,
                    timeout=args.timeout,
                    max_in_flight=args.max_in_flight,
                    poisson=args.poisson,
                    seed=args.seed,
                    progress=progress,
                )
            )
    else:
        for i, c in enumerate(args.concurrency):
            runs.append(
                await run_closed(
                    _level(endpoints[0], levels[0], i),
                    concurrency=c,
                    total=args.requests,
                    timeout=args.timeout,
                    progress=progress,
                )
            )
    return runs, comparisons


def run(args: argparse.Namespace, argv: list[str] | None = None) -> int:
    from gateway.bench.driver import Endpoint
    from gateway.bench.redact import Redactor
    from gateway.bench.report import environment, summarize, write_json, write_markdown, write_plots
    from gateway.bench.workload import WorkloadSpec, build_workload, load_token_counter

    try:
        for name in ("api_key", "compare_api_key"):
            path = getattr(args, f"{name}_file")
            if path:
                setattr(args, name, Path(path).read_text(encoding="utf-8").strip())
    except OSError as exc:
        print(f"rerank-gateway bench: cannot read the key file: {exc.strerror}: {exc.filename}", file=sys.stderr)
        return 2
    # Every output below goes through the redactor: reports get shared, keys must not be in them.
    redactor = Redactor(keys=(args.api_key, args.compare_api_key), headers=args.header, urls=(args.url, args.compare))
    try:
        url = _endpoint_url(args.url)
        compare_url = _endpoint_url(args.compare) if args.compare else None
        if args.compare and args.rate:
            raise ValueError("--compare runs closed loop: use --concurrency, not --rate")
        counter = load_token_counter(args.tokenizer)
        spec = WorkloadSpec(
            requests=min(args.requests, 512),  # distinct bodies; longer runs cycle through them
            documents=args.documents,
            query_tokens=args.query_tokens,
            doc_tokens=args.doc_tokens,
            duplicate_share=args.duplicates,
            top_n=args.top_n,
            instruction=args.instruction,
            model=args.model,
            seed=args.seed,
            docs_file=args.docs_file,
            queries_file=args.queries_file,
        )
        requests = build_workload(spec, counter)
        seeds = [spec.seed + LEVEL_SEED_STEP * i for i in range(len(args.rate or args.concurrency))]
        workloads = [[requests] + [build_workload(msgspec.structs.replace(spec, seed=s), counter) for s in seeds[1:]]]
        measured = [r for level in workloads[0] for r in level]
        warm_spec = msgspec.structs.replace(spec, requests=max(1, args.warmup), seed=spec.seed + 1_000_003)
        warmup = build_workload(warm_spec, counter) if args.warmup > 0 else []
        endpoints = [
            Endpoint(
                label=redactor.scrub(_label(url, args.label)),
                url=url,
                headers=_headers(args.header, args.api_key),
                requests=requests,
                warmup=warmup,
            )
        ]
        if compare_url:
            other = msgspec.structs.replace(spec, model=args.compare_model or args.model)
            endpoints.append(
                Endpoint(
                    label=redactor.scrub(_label(compare_url, args.compare_label)),
                    url=compare_url,
                    headers=_headers(args.header, args.compare_api_key or args.api_key),
                    requests=build_workload(other, counter),
                    warmup=build_workload(msgspec.structs.replace(warm_spec, model=other.model), counter)
                    if warmup
                    else [],
                )
            )
            workloads.append(
                [endpoints[1].requests]
                + [build_workload(msgspec.structs.replace(other, seed=s), counter) for s in seeds[1:]]
            )
            if endpoints[0].label == endpoints[1].label:
                endpoints[1].label += " (compare)"
        # Before the run, not after it: a folder that cannot be made must not cost the results.
        out_dir = Path(args.out or f"bench-out/{dt.datetime.now(dt.UTC).strftime('%Y%m%d-%H%M%S')}")
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OSError(f"--out {out_dir}: cannot create the folder ({exc.strerror or type(exc).__name__})") from None
        _model_required(url, args.model, "--model")
        if compare_url:
            _model_required(compare_url, args.compare_model or args.model, "--compare-model (or --model)")
    except (ValueError, OSError) as exc:
        print(redactor.scrub(f"rerank-gateway bench: {exc}"), file=sys.stderr)
        return 2

    levels = len(args.rate or args.concurrency) * len(endpoints)
    bar = None
    if not args.no_progress:
        from tqdm import tqdm

        bar = tqdm(total=args.requests * levels, unit="req", desc="bench", file=sys.stderr)
    errors = 0

    def progress(sample: Any) -> None:
        nonlocal errors
        errors += not sample.ok
        if bar is not None:
            bar.update(1)
            if not sample.ok:
                bar.set_postfix(errors=errors)

    try:
        runs, comparisons = asyncio.run(_drive(args, endpoints, progress, workloads))
    finally:
        if bar is not None:
            bar.close()

    summaries = [summarize(r) for r in runs]
    n = len(measured) * args.documents
    doc = {
        "tool": "rerank-gateway bench",
        "command": redactor.command(argv if argv is not None else sys.argv[2:]),
        "environment": environment(),
        "workload": msgspec.to_builtins(spec) | {"requests": args.requests, "distinct_requests": len(requests)},
        "workload_description": spec.describe(),
        "measured": (
            f"query {sum(r.query_tokens for r in measured) / len(measured):.1f} tokens, document "
            f"{sum(r.doc_tokens for r in measured) / n:.1f} tokens on average, "
            f"{sum(r.unique_documents for r in measured) / len(measured):.1f} unique documents per request "
            + ("(exact, with the given tokenizer)" if counter.exact else "(estimated: 1 word = 1 token)")
        ),
        "summaries": summaries,
        "comparisons": comparisons,
        "latencies_ms": [
            {
                "endpoint": r.endpoint,
                "concurrency": r.concurrency,
                "rate": r.rate,
                "ok": [round(s.latency_s * 1e3, 3) for s in r.samples if s.ok],
                "failed": [round(s.latency_s * 1e3, 3) for s in r.samples if not s.ok],
            }
            for r in runs
        ],
    }
    # Results first: a failing or missing plotting library must never lose a finished run.
    doc["plots"] = []
    doc = redactor.scrub_tree(doc)
    write_json(out_dir / "bench.json", doc)
    write_markdown(out_dir / "report.md", doc, title=args.title)
    # A run where nothing succeeded has nothing to draw (matplotlib only warns about empty axes).
    if not args.no_plot and any(s["ok"] for s in summaries):
        try:
            doc["plots"] = write_plots(out_dir, runs, summaries)
        except ImportError as exc:
            print(
                f"plots skipped: {exc.name or 'matplotlib'} is not installed "
                "(pip install 'rerank-gateway[bench]'); results are in bench.json and report.md",
                file=sys.stderr,
            )
        if doc["plots"]:
            write_json(out_dir / "bench.json", doc)
            write_markdown(out_dir / "report.md", doc, title=args.title)
    print((out_dir / "report.md").read_text(encoding="utf-8"))
    print(redactor.scrub(f"wrote {out_dir}/bench.json, report.md" + "".join(f", {p}" for p in doc["plots"])))
    total_ok = sum(s["ok"] for s in summaries)
    if total_ok == 0 or (args.strict and errors):
        for s in summaries:
            if s["first_error"]:
                print(redactor.scrub(f"{s['endpoint']}: first error: {s['first_error']}"), file=sys.stderr)
        return 1
    return 0
