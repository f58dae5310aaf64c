"""Eval results: per-model speed figures, the JSON file, the Markdown report and the plot of
quality against speed (``gateway.bench.report`` writes the JSON and records the machine)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gateway.bench.report import percentile
from gateway.eval.driver import Answer

__all__ = ("speed", "write_markdown", "write_plot")

FIRST_STAGE = "first stage"


def speed(answers: Sequence[Answer]) -> dict[str, Any]:
    """Latency p50 / p99 of the requests (each one model's alone: they ran one at a time) and
    documents per second of request time."""
    lat = sorted(a.latency_s * 1e3 for a in answers)
    busy = sum(a.latency_s for a in answers)
    tokens = [a.tokens for a in answers if a.tokens is not None]
    return {
        "requests": len(answers),
        "documents": sum(a.documents for a in answers),
        "latency_ms": {"p50": percentile(lat, 50), "p99": percentile(lat, 99), "max": lat[-1] if lat else math.nan},
        "docs_per_s": sum(a.documents for a in answers) / busy if busy else math.nan,
        "input_tokens": sum(tokens) if len(tokens) == len(answers) else None,
    }


def _fmt(x: float | None, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:,.{digits}f}"


def _p(p: float) -> str:
    if math.isnan(p):
        return "– (every query equal)"
    return f"{p:.2g}" if p >= 1e-4 else "< 1e-4"


def write_markdown(path: Path, doc: dict[str, Any], *, title: str) -> None:
    env, data, q = doc["environment"], doc["data"], doc["quality"]
    metrics = doc["metrics"]
    lines = [
        f"# {title}",
        "",
        f"- date: {env['date_utc']}; machine: {env['cpus']} CPUs, {env['cpu'] or env['platform']}"
        + (f"; load average at start {doc['load_average']}" if doc.get("load_average") else ""),
        "- versions: " + ", ".join(f"{k} {v}" for k, v in env["versions"].items()),
        (
            f"- data: {data['source']}: {data['queries']} judged queries, {data['documents']} documents, "
            f"{data['judgements']} judgements; candidates: {data['first_stage']}, top {data['depth']} per query"
        ),
        f"- endpoint: {doc['endpoint']}; requests one at a time, models interleaved query by query",
        f"- command: `{doc['command']}`",
        "",
        "| system | " + " | ".join(metrics) + " | p50 ms | p99 ms | docs/s |",
        "|---|" + "---|" * (len(metrics) + 3),
    ]
    for name, means in q["mean"].items():
        s = doc["speed"].get(name)
        figures = [_fmt(means[m]) for m in metrics]
        timing = (
            [_fmt(s["latency_ms"]["p50"], 1), _fmt(s["latency_ms"]["p99"], 1), _fmt(s["docs_per_s"], 0)]
            if s
            else ["–", "–", "–"]
        )
        lines.append(f"| {name} | " + " | ".join(figures + timing) + " |")
    test = "paired Student's t-test" if q["stat_test"] == "student" else "Fisher's randomization test"
    lines += [
        "",
        f"Differences (b − a, over the same queries; {test} by ranx, significant at p ≤ {q['max_p']:g}):",
        "",
        "| a | b | metric | Δ | p | significant |",
        "|---|---|---|---|---|---|",
    ]
    for t in q["tests"]:
        if t["metric"] in metrics[:2]:
            lines.append(
                f"| {t['a']} | {t['b']} | {t['metric']} | {t['delta']:+.4f} | {_p(t['p_value'])} | "
                f"{'yes' if t['significant'] else 'no'} |"
            )
    lines += ["", "Every test (Recall included) and each query's figures and latency are in `eval.json`.", ""]
    for name in doc.get("plots", []):
        lines += [f"![{name}]({name})", ""]
    path.write_text("\n".join(lines), encoding="utf-8")


def write_plot(out_dir: Path, doc: dict[str, Any]) -> list[str]:
    """quality_speed.png: nDCG@10 against documents per second, one point per model; the first
    stage's nDCG@10 as a line (it costs no reranking)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, s in doc["speed"].items():
        y = doc["quality"]["mean"][name]["ndcg@10"]
        ax.scatter([s["docs_per_s"]], [y], s=40)
        ax.annotate(name, (s["docs_per_s"], y), textcoords="offset points", xytext=(6, 4), fontsize=8)
    base = doc["quality"]["mean"].get(FIRST_STAGE)
    if base is not None:
        ax.axhline(base["ndcg@10"], linestyle="--", color="grey", linewidth=1, label=f"{FIRST_STAGE} (no reranking)")
        ax.legend(fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("documents / s (log scale, one request at a time)")
    ax.set_ylabel("nDCG@10")
    ax.set_title("Quality against speed")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out_dir / "quality_speed.png", dpi=110)
    plt.close(fig)
    return ["quality_speed.png"]
