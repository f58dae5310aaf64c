"""Benchmark results: statistics, a JSON file, a Markdown report and PNG plots.

Every request counts. Latency percentiles are over *all* requests of a level: a failed request
enters at the time it took to fail, a timed-out one at its full wait (at least ``--timeout``), so
the slowest requests of all -- the ones that never answered -- reach p99 and max instead of leaving
the distribution. The successful requests' own percentiles are kept beside them (``latency_ok_ms``)
and failures are reported per level (count, share, by status). Throughput is *goodput*: documents
of OK requests over the wall time of the level, which the failed requests' time is part of (for
``--compare``, the sum of the endpoint's own rounds). Tokens per second are *content* tokens (query
tokens x documents + document tokens, as the workload measured them); when the server reports its
own token count (``meta.tokens.input_tokens`` or ``usage.total_tokens``, template included) that
rate is shown too.

Each summary also carries a bootstrap interval of p50 and p99 (``latency_spread_ms``): how far the
same level's percentile moves when its requests are resampled, the least run-to-run spread a
verdict against a target must clear (``benchmarks/gpu_suite/report.py``).
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import math
import os
import platform
import random
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from gateway.bench.driver import LevelRun

__all__ = ("environment", "percentile", "summarize", "write_json", "write_markdown", "write_plots")


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), ``q`` in [0, 100]."""
    if not sorted_values:
        return float("nan")
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _error_key(status: int, error: str | None, timed_out: bool = False) -> str:
    if timed_out:
        return "timeout"
    if status == 0:
        return "no response: " + (error or "?").split(":")[0]
    if status == 200:
        return "200 with a bad body"
    return str(status)


def _latency(lat_ms: Sequence[float]) -> dict[str, float]:
    """mean / min / p50 / p90 / p99 / max of latencies already sorted (NaN when there are none)."""
    return {
        "mean": sum(lat_ms) / len(lat_ms) if lat_ms else float("nan"),
        "min": lat_ms[0] if lat_ms else float("nan"),
        "p50": percentile(lat_ms, 50),
        "p90": percentile(lat_ms, 90),
        "p99": percentile(lat_ms, 99),
        "max": lat_ms[-1] if lat_ms else float("nan"),
    }


# Resamples of the bootstrap and the seed: the same samples always give the same interval.
BOOTSTRAP_RESAMPLES = 400


def bootstrap_interval(
    values: Sequence[float], q: float, *, level: float = 0.95, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0
) -> tuple[float, float]:
    """The central ``level`` interval of the ``q``-th percentile over resamples of ``values``.

    A percentile-bootstrap: with few samples above the percentile (p99 of 100 is the
    interpolation between the two largest) the interval is wide, which is the point -- a verdict
    must not rest on one or two requests."""
    if len(values) < 2:
        return (float("nan"), float("nan"))
    rng = random.Random(seed)
    n = len(values)
    stats = sorted(percentile(sorted(rng.choices(values, k=n)), q) for _ in range(resamples))
    tail = (1.0 - level) / 2 * 100
    return (percentile(stats, tail), percentile(stats, 100 - tail))


def summarize(run: LevelRun) -> dict[str, Any]:
    ok = [s for s in run.samples if s.ok]
    failed = [s for s in run.samples if not s.ok]
    # Every request, failed and timed out included: a timeout is the slowest request of all.
    lat = sorted(s.latency_s * 1e3 for s in run.samples)
    wall = run.wall_s or float("nan")
    server = [s.server_tokens for s in ok if s.server_tokens is not None]
    errors = Counter(_error_key(s.status, s.error, s.timed_out) for s in failed)
    first_error = next((s.error for s in failed if s.error), None)
    return {
        "endpoint": run.endpoint,
        "mode": run.mode,
        "concurrency": run.concurrency,
        "rate": run.rate,
        "requests": len(run.samples),
        "ok": len(ok),
        "failed": len(failed),
        "timed_out": sum(s.timed_out for s in failed),
        "wall_s": run.wall_s,
        "req_per_s": len(ok) / wall,
        "docs_per_s": sum(s.documents for s in ok) / wall,
        "tokens_per_s": sum(s.content_tokens for s in ok) / wall,
        "server_tokens_per_s": (sum(server) / wall) if len(server) == len(ok) and ok else None,
        "latency_ms": _latency(lat),
        "latency_ok_ms": _latency(sorted(s.latency_s * 1e3 for s in ok)),
        "latency_spread_ms": {"p50": bootstrap_interval(lat, 50), "p99": bootstrap_interval(lat, 99)},
        "errors": dict(errors),
        "first_error": first_error,
        "server_timing_ms": _server_timing(run.samples),
        "server_timing_pct_ms": _server_timing_percentiles(run.samples),
        "server_timing_requests": _server_timing_requests(run.samples),
    }


def _header_values(samples: Sequence[Any], field: str) -> list[float]:
    """One timing header over every request that carried it -- failed ones too: a 503 after a
    queue wait is server time like any other. A request with no answer (transport error, timeout)
    carries none; ``server_timing_requests`` says how many requests each figure covers."""
    return [v for s in samples if (v := getattr(s, field)) is not None]


_TIMING_FIELDS = ("process_ms", "tokenize_ms", "inference_ms")


def _server_timing(samples: Sequence[Any]) -> dict[str, float] | None:
    """Means of the server's timing headers, and what is left for transport + client."""
    out: dict[str, float] = {}
    for field in _TIMING_FIELDS:
        values = _header_values(samples, field)
        if values:
            out[field.removesuffix("_ms")] = sum(values) / len(values)
    if "process" in out:
        timed = [s for s in samples if s.process_ms is not None]
        out["outside_server"] = sum(s.latency_s * 1e3 - s.process_ms for s in timed) / len(timed)
    return out or None


def _server_timing_percentiles(samples: Sequence[Any]) -> dict[str, dict[str, float]] | None:
    """p50 / p99 / max of each timing header and of what lies outside the server, per request:
    the means hide where a tail lives (one slow tokenization vs one slow step)."""
    out: dict[str, dict[str, float]] = {}
    for field in _TIMING_FIELDS:
        values = _header_values(samples, field)
        if values:
            out[field.removesuffix("_ms")] = _pcts(values)
    if "process" in out:
        out["outside_server"] = _pcts([s.latency_s * 1e3 - s.process_ms for s in samples if s.process_ms is not None])
    return out or None


def _server_timing_requests(samples: Sequence[Any]) -> dict[str, int]:
    return {field.removesuffix("_ms"): len(_header_values(samples, field)) for field in _TIMING_FIELDS}


def _pcts(values: Sequence[float]) -> dict[str, float]:
    v = sorted(values)
    return {"p50": percentile(v, 50), "p99": percentile(v, 99), "max": v[-1]}


def environment() -> dict[str, Any]:
    from gateway import __version__

    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {"rerank-gateway": __version__, "python": sys.version.split()[0]}
    for dist in ("httpx", "msgspec", "litestar", "uvicorn", "vllm", "torch", "transformers"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return {
        "date_utc": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "host": platform.node(),
        "platform": platform.platform(),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "versions": versions,
    }


def ratios(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float]:
    """a / b for the figures a comparison is about."""

    def div(x: float, y: float) -> float:
        return x / y if y else float("nan")

    return {
        "req_per_s": div(a["req_per_s"], b["req_per_s"]),
        "docs_per_s": div(a["docs_per_s"], b["docs_per_s"]),
        "p50": div(a["latency_ms"]["p50"], b["latency_ms"]["p50"]),
        "p99": div(a["latency_ms"]["p99"], b["latency_ms"]["p99"]),
        "p50_diff_ms": a["latency_ms"]["p50"] - b["latency_ms"]["p50"],
    }


def write_json(path: Path, doc: dict[str, Any]) -> None:
    path.write_bytes(msgspec.json.format(msgspec.json.encode(doc), indent=1))


def _fmt(x: float | None, digits: int = 0) -> str:
    if x is None or math.isnan(x):
        return "–"
    return f"{x:,.{digits}f}"


def _load(s: dict[str, Any], open_suffix: str = " open") -> str:
    return f"{s['concurrency']} clients" if s["mode"] == "closed" else f"{s['rate']:g} req/s{open_suffix}"


def _failed(s: dict[str, Any]) -> str:
    n = s.get("failed", s["requests"] - s["ok"])
    return f"{n} ({100 * n / s['requests']:.1f} %)" if n and s["requests"] else "0"


def markdown_table(summaries: Sequence[dict[str, Any]]) -> str:
    head = (
        "| endpoint | load | requests | failed | req/s | docs/s | tokens/s | p50 ms | p90 ms | p99 ms | max ms | errors |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    rows = []
    for s in summaries:
        lat = s["latency_ms"]
        errs = ", ".join(f"{k}: {v}" for k, v in s["errors"].items()) or "none"
        rows.append(
            f"| {s['endpoint']} | {_load(s)} | {s['requests']} | {_failed(s)} | {_fmt(s['req_per_s'], 1)} | "
            f"{_fmt(s['docs_per_s'])} | {_fmt(s['tokens_per_s'])} | {_fmt(lat['p50'], 2)} | {_fmt(lat['p90'], 2)} | "
            f"{_fmt(lat['p99'], 2)} | {_fmt(lat['max'], 2)} | {errs} |"
        )
    legend = (
        "\nLatency is over every request, failed and timed-out ones included (each at the time it took; a "
        "timeout at its whole wait). req/s, docs/s and tokens/s count the OK requests over the level's wall time, "
        "which the failed requests' time is part of.\n"
    )
    failures = []
    for s in summaries:
        if s.get("failed", s["requests"] - s["ok"]):
            ok_lat = s.get("latency_ok_ms") or {}
            failures.append(
                f"- {s['endpoint']}, {_load(s, '')}: {_failed(s)} of {s['requests']} requests failed "
                f"({', '.join(f'{k}: {v}' for k, v in s['errors'].items())}); the {s['ok']} OK requests alone: p50 "
                f"{_fmt(ok_lat.get('p50'), 2)}, p99 {_fmt(ok_lat.get('p99'), 2)}, max {_fmt(ok_lat.get('max'), 2)} ms"
                + (f"; first error: {s['first_error']}" if s.get("first_error") else "")
            )
    failed = ("\nFailed requests:\n\n" + "\n".join(failures) + "\n") if failures else ""
    notes = []
    for s in summaries:
        t = s.get("server_timing_ms")
        if t:
            pct = s.get("server_timing_pct_ms") or {}
            counts = s.get("server_timing_requests") or {}
            covered = counts.get("process", s["requests"])
            of = f" (timing headers on {covered} of {s['requests']} requests)" if covered != s["requests"] else ""
            notes.append(
                f"- {s['endpoint']}, {_load(s, '')}{of}: ms per request, mean (p50 / p99 / max): "
                + ", ".join(
                    f"{k.replace('_', ' ')} {v:.2f}"
                    + (" ({p50:.2f} / {p99:.2f} / {max:.2f})".format(**pct[k]) if k in pct else "")
                    for k, v in t.items()
                )
            )
    split = (
        (
            "\nServer timing headers (process = request in to response out; outside server = client + "
            "transport):\n\n" + "\n".join(notes) + "\n"
        )
        if notes
        else ""
    )
    return head + "\n".join(rows) + "\n" + legend + failed + split


def write_markdown(path: Path, doc: dict[str, Any], *, title: str = "Rerank benchmark") -> None:
    env = doc["environment"]
    lines = [
        f"# {title}",
        "",
        f"- date: {env['date_utc']}; machine: {env['cpus']} CPUs, {env['cpu'] or env['platform']}",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in env["versions"].items()),
        f"- workload: {doc['workload_description']}",
        f"- measured lengths: {doc['measured']}",
        f"- command: `{doc['command']}`",
        "",
        markdown_table(doc["summaries"]),
    ]
    for cmp in doc.get("comparisons", []):
        r = cmp["ratios"]
        lines += [
            (
                f"**{cmp['a']} / {cmp['b']}** at {cmp['concurrency']} clients (rounds of {cmp['round_size']} "
                f"requests, ABBA order): req/s x{r['req_per_s']:.2f}, docs/s x{r['docs_per_s']:.2f}, "
                f"p50 x{r['p50']:.2f} ({r['p50_diff_ms']:+.2f} ms), p99 x{r['p99']:.2f}"
                + (
                    f"; failed requests: {cmp['failed'][0]} and {cmp['failed'][1]}."
                    if any(cmp.get("failed") or ())
                    else "."
                )
            ),
            "",
        ]
    for name in doc.get("plots", []):
        lines += [f"![{name}]({name})", ""]
    path.write_text("\n".join(lines), encoding="utf-8")


def write_plots(out_dir: Path, runs: Sequence[LevelRun], summaries: Sequence[dict[str, Any]]) -> list[str]:
    """latency_cdf.png always; throughput.png when an endpoint ran at several concurrencies."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    written = []
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for run in runs:
        # Every request, failed ones included, each at its latency; failures also get a red x on the curve.
        points = sorted((s.latency_s * 1e3, s.ok) for s in run.samples)
        if not points:
            continue
        load = f"c={run.concurrency}" if run.mode == "closed" else f"{run.rate:g} req/s"
        n_failed = sum(not ok for _, ok in points)
        label = f"{run.endpoint} {load}" + (f" ({n_failed} failed)" if n_failed else "")
        fractions = [(i + 1) / len(points) for i in range(len(points))]
        ax.plot([x for x, _ in points], fractions, label=label)
        bad = [(x, f) for (x, ok), f in zip(points, fractions, strict=True) if not ok]
        if bad:
            ax.plot([x for x, _ in bad], [f for _, f in bad], "x", color="red", markersize=7)
    ax.set_xscale("log")
    ax.set_xlabel("latency (ms, log scale)")
    ax.set_ylabel("fraction of requests")
    ax.set_title("Latency CDF (every request; red x: failed)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / "latency_cdf.png", dpi=110)
    plt.close(fig)
    written.append("latency_cdf.png")

    by_ep: dict[str, list[dict[str, Any]]] = {}
    for s in summaries:
        if s["mode"] == "closed":
            by_ep.setdefault(s["endpoint"], []).append(s)
    if any(len({s["concurrency"] for s in v}) > 1 for v in by_ep.values()):
        fig, ax = plt.subplots(figsize=(7, 4.2))
        ax2 = ax.twinx()
        for ep, ss in by_ep.items():
            ss = sorted(ss, key=lambda s: s["concurrency"])
            xs = [s["concurrency"] for s in ss]
            ax.plot(xs, [s["docs_per_s"] for s in ss], marker="o", label=f"{ep} docs/s")
            ax2.plot(xs, [s["latency_ms"]["p99"] for s in ss], marker="x", linestyle="--", label=f"{ep} p99 ms")
            for s in ss:  # a level with failures is marked and labelled: its docs/s is goodput
                if s.get("failed"):
                    ax.plot([s["concurrency"]], [s["docs_per_s"]], "o", color="red", markersize=9, fillstyle="none")
                    ax.annotate(
                        f"{s['failed']} failed",
                        (s["concurrency"], s["docs_per_s"]),
                        fontsize=7,
                        color="red",
                        textcoords="offset points",
                        xytext=(4, -10),
                    )
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel("documents / s (OK requests)")
        ax2.set_ylabel("p99 latency (ms)")
        ax.set_title("Throughput vs concurrency")
        ax.grid(True, alpha=0.3)
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = ax2.get_legend_handles_labels()
        ax.legend(h1 + h2, l1 + l2, fontsize=8, loc="upper left")
        fig.tight_layout()
        fig.savefig(out_dir / "throughput.png", dpi=110)
        plt.close(fig)
        written.append("throughput.png")
    return written
