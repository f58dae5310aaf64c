"""cpu_encoders.md: one table per shape, the openvino engine's insides and skips."""

from __future__ import annotations

import re
from typing import Any

from benchmarks.cpu_encoders.contestants import TORCH
from benchmarks.cpu_encoders.measure import DOC_TOKENS, DOCS
from benchmarks.harness import table


def markdown(report: dict[str, Any]) -> str:
    out = [
        f"# CPU encoder rerankers, {report['date']}",
        "",
        report["command"],
        "",
        (
            f"Machine: {report['machine']}. Workload: 1 query x {DOCS} documents of {DOC_TOKENS} tokens; "
            f"{report['rounds']} interleaved rounds; docs/s medians over rounds; ratios are medians of per-round ratios "
            f"to the baseline; top-10 order vs the gateway's transformers engine's fp32 scores (else the baseline's)."
        ),
        "",
    ]
    for shape in report["shapes"]:
        loads = [rd["load_before"] for rd in shape["rounds"]] + [rd["load_after"] for rd in shape["rounds"]]
        out += [
            f"## {shape['shape']} ({shape['checkpoint']})",
            "",
            (
                f"Baseline: {shape.get('baseline', TORCH)}. "
                f"CPU-bound processes beside the timed rounds: {shape.get('busy', 0)}. "
                f"Load average (1 min) during the run: {min(loads):.2f}-{max(loads):.2f}."
            ),
            "",
            "Per round (1-minute load average before / after): "
            + ", ".join(f"{rd['round']}: {rd['load_before']:.2f} / {rd['load_after']:.2f}" for rd in shape["rounds"])
            + ".",
            "",
        ]
        nan, rows = float("nan"), []
        for e in shape["table"]:
            a = e.get("agreement", {})
            kept = f"{a['queries_kept']}/{a['queries']}" if a else "-"
            rows.append([e["contestant"], f"{e['docs_s_1']:.1f}", f"{e.get('vs_baseline', nan):.2f}x"])
            rows[-1] += [f"{e['docs_s_4']:.1f}", f"{e['four_vs_one']:.2f}x", f"{e['docs_per_cpu_s']:.1f}"]
            rows[-1] += [f"{e.get('cpu_vs_baseline', nan):.2f}x", f"{e['docs_per_cpu_s_4']:.1f}"]
            rows[-1] += [f"{e['four_vs_one_cpu']:.2f}x", kept, f"{a.get('mean_shared_top10', nan):.1f}"]
            rows[-1] += [f"{a.get('max_abs_delta', nan):.1e}", _gate(e)]
        head = ["contestant", "docs/s, 1 client", "vs baseline", "docs/s, 4 clients", "4 clients vs 1"]
        head += ["docs per CPU-s", "vs baseline (CPU)", "docs per CPU-s, 4 clients", "4 vs 1 (CPU)"]
        out += table([*head, "top-10 order kept", "top-10 shared", "max abs Δ", "parity gate (golden set)"], rows)
        engines = [e for e in shape["table"] if "engine" in e]
        if engines:
            out += [
                "",
                (
                    "Inside the openvino engine (medians over rounds): the streams' busy share of the wall clock, "
                    "the padding share of the computed tokens, rows per batch."
                ),
                "",
            ]
            head = ["contestant", "streams busy, 1 client", "4 clients", "padding, 1 client", "4 clients"]
            rows = [
                [e["contestant"], *(f"{g[f'streams_busy_{n}']:.0%}" for n in (1, 4))]
                + [*(f"{g[f'padding_{n}']:.1%}" for n in (1, 4)), *(f"{g[f'rows_per_batch_{n}']:.1f}" for n in (1, 4))]
                for e in engines
                for g in [e["engine"]]
            ]
            out += table([*head, "rows per batch, 1 client", "4 clients"], rows)
        for name, why in shape["skipped"].items():
            out.append(f"\nSkipped: {name}: {why}")
        out.append("")
    return "\n".join(out)


def _gate(entry: dict[str, Any]) -> str:
    if "inference_precision" in entry.get("peer", {}):  # a peer: what its plugin computes in
        precision = re.sub(r"<Type: '(\w+)'>", r"\1", entry["peer"]["inference_precision"])  # older runs' repr
        return f"- (computes in {precision})"
    kept = (entry.get("gateway_model") or {}).get("parity_kept")
    if not kept:
        return "exact" if (entry.get("gateway_model") or {}).get("precision") == "fp32" else "-"
    k, n = (int(x) for x in kept.split("/"))
    share = (entry.get("gateway_model") or {}).get("refined_share")
    refined = f" ({float(share):.0%} of documents re-scored in fp32)" if share else ""
    return f"{kept} kept: {'passes' if k / n >= 0.99 else 'refused by default'}{refined}"
