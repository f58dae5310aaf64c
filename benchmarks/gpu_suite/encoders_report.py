"""The Markdown summary of a ``benchmarks/gpu_suite/encoders.py`` run (``encoders_summary.md``), from its results JSON."""

from __future__ import annotations

import json
from typing import Any

from benchmarks.gpu_suite.encoder_checkpoint import DOC_TOKENS, DOCS, QUERY_TOKENS
from benchmarks.harness import table

__all__ = ("TITLE", "summary")

TITLE = "bge-reranker-v2-m3 shape (XLM-R large)"


def summary(results: dict[str, Any]) -> str:
    floor = results.get("floor") or {}
    lines = [
        f"# {results.get('title', TITLE)}, d100, over HTTP: {results.get('device', '?')} ({results['date_utc']})",
        "",
        (
            f"Workload: 1 query x {DOCS} documents of U[{DOC_TOKENS.replace('-', ',')}] tokens, query {QUERY_TOKENS} tokens: "
            f"{floor.get('tokens_per_request', 0):,.0f} tokens and {floor.get('tflop_per_request', 0):.2f} TFLOP per request. "
            f"Gateway event loop: {results.get('event_loop', 'asyncio (not recorded before 2026-12-02)')}."
        ),
        "",
    ]
    if floor.get("ms_at_100pct_square"):
        lines += [
            (
                f"Compute floor: bf16 matmul {floor['square_tflops']:.0f} TFLOP/s (8192^3), {floor['gemm_tflops']:.0f} TFLOP/s "
                f"(the model's GEMMs at 16k tokens) -> {floor['ms_at_100pct_square']:.1f} ms per request at 100 % "
                f"({floor['docs_per_s_at_100pct']:,.0f} docs/s)."
            ),
            "",
        ]
    rows: list[list[Any]] = []
    for label, e in results["runs"].items():
        by_clients = {r["clients"]: r for r in e.get("rows", [])}
        one, many = by_clients.get(1), by_clients.get(16) or by_clients.get(max(by_clients) if by_clients else 0)
        if not many:
            rows.append([label, "", "", "", "", f"error: {(e.get('error') or 'no rows')[:300]}"])
            continue
        idle = f"{one['p50_ms']:.1f} / {one['p99_ms']:.1f} / {one['max_ms']:.1f}" if one else "-"
        attention = (e.get("engine_stats") or {}).get("attention", "-")
        rows.append([label, f"{e.get('start_s', 0):.0f}", attention, e.get("gpu_ready_mib") or "-", idle])
        rows[-1] += [f"{many['docs_per_s']:,.0f}", _pct(e.get("mfu_many")), _pct(e.get("mfu_one"))]
        rows[-1].append(sum(sum(r["errors"].values()) for r in by_clients.values()))
    head = ["runtime", "start s", "attention", "GPU MiB ready", "d100 x1 p50 / p99 / max ms", "d100 x16 docs/s"]
    lines += table([*head, "MFU x16", "MFU x1 (p50)", "errors"], rows)
    lines += [
        "",
        (
            "Server timing per request, ms: mean (p50 / p99 / max); outside = HTTP + client. Engine steps: "
            "queue, host prep (assemble + pack + launch) and device wait (collect), means per step."
        ),
        "",
    ]
    for label, e in results["runs"].items():
        for r in e.get("rows", []):
            t, pct = r.get("server_timing_ms") or {}, r.get("server_timing_pct_ms") or {}
            lines.append(
                f"- {label} x{r['clients']}: "
                + ", ".join(
                    f"{k} {v:.1f}" + (" ({p50:.1f} / {p99:.1f} / {max:.1f})".format(**pct[k]) if k in pct else "")
                    for k, v in t.items()
                )
            )
            if r.get("graph_captures") is not None:
                lines.append(
                    f"  CUDA graphs captured during it: {r['graph_captures']}; idle steps replayed in a larger "
                    f"bucket: {r.get('covered_steps')} (after a warm pass of {r.get('warm_pass_requests')} requests)"
                )
            if r.get("probe_under_load"):
                lines.append(
                    f"  the probe request during it, against its idle answer: {json.dumps(r['probe_under_load'])}"
                )
        st = e.get("engine_stats_after") or {}
        if "prep_ms_mean" in st:
            lines.append(
                f"- {label} engine: queue {st['queue_ms_mean']:.2f}, step {st['step_ms_mean']:.2f}, host prep "
                f"{st['prep_ms_mean']:.2f}, device wait {st['wait_ms_mean']:.2f} ms (means over {st['steps']} steps); "
                f"latest steps (p50 / p99 / max): {json.dumps(st.get('recent_steps_ms'))}; "
                f"CUDA graphs {json.dumps(st.get('cuda_graphs'))}; requests whose non-finite logits were "
                f"scored again: {st.get('nonfinite_retries', '-')}"
            )
    lines += [
        "",
        (
            "Probe: one d100 request scored twice by each runtime, against plain transformers in fp32 "
            "(random weights bunch the scores: the spread is the reference's max - min)."
        ),
        "",
    ]
    probes = [(label, e["probe"]) for label, e in results["runs"].items() if e.get("probe")]
    head = ["runtime", "max abs diff vs fp32", "top-10 shared", "top-10 same order", "repeat max abs diff", "spread"]
    lines += table(
        head,
        [
            [label, f"{p['max_abs_diff']:.2e}", p["top10_shared"], p["top10_same_order"]]
            + [f"{p['repeat_max_abs_diff']:.2e}", f"{p['spread']:.2e}"]
            for label, p in probes
        ],
    )
    lines += ["", "skipped: " + json.dumps(results["skipped"])]
    return "\n".join(lines) + "\n"


def _pct(x: float | None) -> str:
    return f"{100 * x:.0f} %" if x else "-"
