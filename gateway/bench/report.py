"""Benchmark results: statistics, a JSON file, a Markdown report and PNG plots.

Throughput counts OK requests only, over the wall time of the level (for ``--compare``, the sum
of the endpoint's own rounds). Tokens per second are *content* tokens (query tokens x documents
+ document tokens, as the workload measured them); when the server reports its own token count
(``meta.tokens.input_tokens`` or ``usage.total_tokens``, template included) that rate is shown too.
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import math
import os
import platform
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


def _error_key(status: int, error: str | None) -> str:
    if status == 0:
        return "no response: " + (error or "?").split(":")[0]
    if status == 200:
        return "200 with a bad body"
    return str(status)


def summarize(run: LevelRun) -> dict[str, Any]:
    ok = [s for s in run.samples if s.ok]
    lat = sorted(s.latency_s * 1e3 for s in ok)
    wall = run.wall_s or float("nan")
    server = [s.server_tokens for s in ok if s.server_tokens is not None]
    errors = Counter(_error_key(s.status, s.error) for s in run.samples if not s.ok)
    first_error = next((s.error for s in run.samples if not s.ok and s.error), None)
    return {
        "endpoint": run.endpoint,
        "mode": run.mode,
        "concurrency": run.concurrency,
        "rate": run.rate,
        "requests": len(run.samples),
        "ok": len(ok),
        "wall_s": run.wall_s,
        "req_per_s": len(ok) / wall,
        "docs_per_s": sum(s.documents for s in ok) / wall,
        "tokens_per_s": sum(s.content_tokens for s in ok) / wall,
        "server_tokens_per_s": (sum(server) / wall) if len(server) == len(ok) and ok else None,
        "latency_ms": {
            "mean": sum(lat) / len(lat) if lat else float("nan"),
            "min": lat[0] if lat else float("nan"),
            "p50": percentile(lat, 50),
            "p90": percentile(lat, 90),
            "p99": percentile(lat, 99),
            "max": lat[-1] if lat else float("nan"),
        },
        "errors": dict(errors),
        "first_error": first_error,
        "server_timing_ms": _server_timing(ok),
        "server_timing_pct_ms": _server_timing_percentiles(ok),
    }


def _server_timing(ok: Sequence[Any]) -> dict[str, float] | None:
    """Means of the server's timing headers, and what is left for transport + client."""
    out: dict[str, float] = {}
    for field in ("process_ms", "tokenize_ms", "inference_ms"):
        values = [getattr(s, field) for s in ok if getattr(s, field) is not None]
        if values and len(values) == len(ok):
            out[field.removesuffix("_ms")] = sum(values) / len(values)
    if "process" in out:
        out["outside_server"] = sum(s.latency_s for s in ok) / len(ok) * 1e3 - out["process"]
    return out or None


def _server_timing_percentiles(ok: Sequence[Any]) -> dict[str, dict[str, float]] | None:
    """p50 / p99 / max of each timing header and of what lies outside the server, per request:
    the means hide where a tail lives (one slow tokenization vs one slow step)."""
    out: dict[str, dict[str, float]] = {}
    for field in ("process_ms", "tokenize_ms", "inference_ms"):
        values = [getattr(s, field) for s in ok if getattr(s, field) is not None]
        if values and len(values) == len(ok):
            out[field.removesuffix("_ms")] = _pcts(values)
    if "process" in out:
        out["outside_server"] = _pcts([s.latency_s * 1e3 - s.process_ms for s in ok])
    return out or None


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


def markdown_table(summaries: Sequence[dict[str, Any]]) -> str:
    head = (
        "| endpoint | load | requests (ok) | req/s | docs/s | tokens/s | p50 ms | p90 ms | p99 ms | max ms | errors |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    rows = []
    for s in summaries:
        load = f"{s['concurrency']} clients" if s["mode"] == "closed" else f"{s['rate']:g} req/s open"
        lat = s["latency_ms"]
        errs = ", ".join(f"{k}: {v}" for k, v in s["errors"].items()) or "none"
        rows.append(
            f"| {s['endpoint']} | {load} | {s['requests']} ({s['ok']}) | {_fmt(s['req_per_s'], 1)} | "
            f"{_fmt(s['docs_per_s'])} | {_fmt(s['tokens_per_s'])} | {_fmt(lat['p50'], 2)} | {_fmt(lat['p90'], 2)} | "
            f"{_fmt(lat['p99'], 2)} | {_fmt(lat['max'], 2)} | {errs} |"
        )
    notes = []
    for s in summaries:
        t = s.get("server_timing_ms")
        if t:
            load = f"{s['concurrency']} clients" if s["mode"] == "closed" else f"{s['rate']:g} req/s"
            pct = s.get("server_timing_pct_ms") or {}
            notes.append(f"- {s['endpoint']}, {load}: ms per request, mean (p50 / p99 / max): " + ", ".join(
                f"{k.replace('_', ' ')} {v:.2f}" + (" ({p50:.2f} / {p99:.2f} / {max:.2f})".format(**pct[k]) if k in pct else "")
                for k, v in t.items()))
    split = ("\nServer timing headers (process = request in to response out; outside server = client + "
             "transport):\n\n" + "\n".join(notes) + "\n") if notes else ""
    return head + "\n".join(rows) + "\n" + split


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
                f"p50 x{r['p50']:.2f} ({r['p50_diff_ms']:+.2f} ms), p99 x{r['p99']:.2f}."
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
        lat = sorted(s.latency_s * 1e3 for s in run.samples if s.ok)
        if not lat:
            continue
        load = f"c={run.concurrency}" if run.mode == "closed" else f"{run.rate:g} req/s"
        ax.plot(lat, [(i + 1) / len(lat) for i in range(len(lat))], label=f"{run.endpoint} {load}")
    ax.set_xscale("log")
    ax.set_xlabel("latency (ms, log scale)")
    ax.set_ylabel("fraction of requests")
    ax.set_title("Latency CDF")
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
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel("documents / s")
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
