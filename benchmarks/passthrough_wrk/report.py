"""The targets, and what the runs add up to: medians per target and level, per-round ratios
(passthrough_wrk.json's summary) and passthrough_wrk.md.
"""

from __future__ import annotations

import collections
import statistics
from typing import Any

from benchmarks.harness import table

GATEWAYS = ("gateway-before", "gateway-1w", "gateway-Nw", "gateway-chain-1w")
TARGETS = (*GATEWAYS, "litellm")
# The one-worker targets whose 1-client p50 is compared with the stub's (the latency target).
ONE_WORKER = ("gateway-1w",)


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _round_pairs(
    by: dict[tuple[str, int], list[dict[str, Any]]], a: tuple[str, int], b: tuple[str, int], rounds: list[int]
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The runs of ``a`` and ``b`` (target, clients) made in the same round, round by round."""
    pairs = []
    for rnd in rounds:
        ra = [r for r in by[a] if r["round"] == rnd]
        rb = [r for r in by[b] if r["round"] == rnd]
        if ra and rb:
            pairs.append((ra[0], rb[0]))
    return pairs


def summarize(runs: list[dict[str, Any]], clients: list[int]) -> dict[str, Any]:
    """Medians per target and level, and medians of the per-round ratios."""
    by: dict[tuple[str, int], list[dict[str, Any]]] = collections.defaultdict(list)
    for r in runs:
        by[(r["target"], r["clients"])].append(r)
    summary: dict[str, Any] = {}
    for (t, c), rs in sorted(by.items()):
        summary.setdefault(t, {})[str(c)] = {
            k: _median([r[k] for r in rs if k in r])
            for k in ("req_s", "p50_ms", "p99_ms", "cpu_ms_per_request", "switches_per_request")
        } | {"errors": sum(r["errors"] for r in rs), "runs": len(rs)}
    ratios: dict[str, Any] = {}
    rounds = sorted({r["round"] for r in runs})
    for gw in GATEWAYS:
        for c in clients:
            pairs = _round_pairs(by, (gw, c), ("litellm", c), rounds)
            req = [a["req_s"] / b["req_s"] for a, b in pairs]
            cpu = [b["cpu_ms_per_request"] / a["cpu_ms_per_request"] for a, b in pairs]
            if req:
                ratios[f"{gw} c={c}"] = {
                    "req_s_ratio": _median(req),
                    "cpu_ratio": _median(cpu),
                    "req_s_ratios": req,
                    "cpu_ratios": cpu,
                }
    summary["ratios_vs_litellm"] = ratios
    # Added latency at one client: median per round of (gateway p50 - stub p50).
    lo, hi = min(clients), max(clients)
    summary["added_p50_ms_1_client_by_target"], summary["cpu_growth_by_target"] = {}, {}
    summary["cpu_growth_of_medians_by_target"] = {}
    for gw in ONE_WORKER:
        added = [
            g["p50_ms"] - s["p50_ms"]
            for g, s in _round_pairs(by, (gw, 1), ("stub", 1), rounds)
            if "p50_ms" in g and "p50_ms" in s
        ]
        if added:
            summary["added_p50_ms_1_client_by_target"][gw] = _median(added)
        # CPU growth with load: the median of the per-round pairs (hi clients ÷ lo clients, the
        # two runs seconds apart), like every other ratio here; the ratio of the two medians
        # (what reports before 2026-12-01-direct gave) is kept beside it.
        growth = [
            h["cpu_ms_per_request"] / l_["cpu_ms_per_request"] for h, l_ in _round_pairs(by, (gw, hi), (gw, lo), rounds)
        ]
        if growth:
            summary["cpu_growth_by_target"][gw] = _median(growth)
        flat = [r["cpu_ms_per_request"] for r in by[(gw, hi)]], [r["cpu_ms_per_request"] for r in by[(gw, lo)]]
        if all(flat):
            summary["cpu_growth_of_medians_by_target"][gw] = _median(flat[0]) / _median(flat[1])
    # The names earlier reports used (uvicorn, one worker).
    summary["added_p50_ms_1_client"] = summary["added_p50_ms_1_client_by_target"].get("gateway-1w", float("nan"))
    if "gateway-1w" in summary["cpu_growth_by_target"]:
        summary["gateway_1w_cpu_growth"] = summary["cpu_growth_by_target"]["gateway-1w"]
    # A healthy chain's overhead (--chain): gateway-chain-1w ÷ gateway-1w, median of the per-round pairs.
    chain: dict[str, Any] = {}
    for c in clients:
        pairs = _round_pairs(by, ("gateway-chain-1w", c), ("gateway-1w", c), rounds)
        if pairs:
            chain[str(c)] = {
                k: _median([a[k] / b[k] for a, b in pairs if a.get(k) and b.get(k)])
                for k in ("cpu_ms_per_request", "p50_ms", "p99_ms", "req_s")
            } | {
                "pairs": len(pairs),
                "cpu_ratios": [a["cpu_ms_per_request"] / b["cpu_ms_per_request"] for a, b in pairs],
            }
    if chain:
        summary["chain_vs_plain"] = chain
    summary["loadavg_1min"] = {
        "min": min(r["loadavg_before"][0] for r in runs),
        "median": _median([r["loadavg_before"][0] for r in runs]),
        "max": max(r["loadavg_before"][0] for r in runs),
    }
    return summary


def render(results: dict[str, Any]) -> str:
    s = results["summary"]
    w = results["workload"]
    lines = [
        f"# Passthrough with wrk: gateway (pool engine) vs LiteLLM ({results['date'][:10]})",
        "",
        (
            f"- Machine: {results['machine']['cpus']} CPUs, Python {results['machine']['python']}; shared with other work: "
            f"1-min load average during the runs {s['loadavg_1min']['min']:.2f}-{s['loadavg_1min']['max']:.2f} "
            f"(median {s['loadavg_1min']['median']:.2f}), so absolute figures are noisy; ratios are medians of per-round pairs."
        ),
        (
            f"- Workload: one {w['body_bytes']}-byte body, {w['documents']} documents, top_n {w['top_n']}; wrk -t1, "
            f"{w['seconds_per_run']:g} s per run, {w['rounds']} rounds, target order rotated each round; "
            f"N-worker gateway: {w['workers']} workers. LiteLLM {results.get('litellm_version', '(not run)')}, one worker."
        ),
        f"- Command: `{results['command']}`",
        *(
            [
                "- During each run the other proxies were stopped (SIGSTOP; the stub always runs). Idle CPU, share "
                "of a core, before the rounds: "
                + ", ".join(f"{k} {v:.3f}" for k, v in results["idle_cpu_share"].items())
            ]
            if results.get("other_targets_paused")
            else []
        ),
        "",
    ]
    head = ["target", "clients", "req/s", "p50 ms", "p99 ms", "CPU ms / request"]
    lines += table(
        [*head, "voluntary context switches / request", "errors"],
        [
            [t, c, f"{v['req_s']:.0f}", f"{v['p50_ms']:.2f}", f"{v['p99_ms']:.2f}", f"{v['cpu_ms_per_request']:.3f}"]
            + [f"{v.get('switches_per_request', float('nan')):.1f}", v["errors"]]
            for t in ("stub", *TARGETS)
            for c, v in s.get(t, {}).items()
        ],
    )
    ratios = [[k, f"{v['req_s_ratio']:.2f}×", f"{v['cpu_ratio']:.2f}×"] for k, v in s["ratios_vs_litellm"].items()]
    head = ["gateway ÷ LiteLLM (median of rounds)", "req/s", "CPU per request, LiteLLM's ÷ ours"]
    lines += ["", *table(head, ratios), ""]
    for gw, v in s.get("added_p50_ms_1_client_by_target", {}).items():
        lines.append(f"Added p50 over the stub alone at 1 client ({gw}): {v:.2f} ms.")
    of_medians = s.get("cpu_growth_of_medians_by_target", {})
    for gw, v in s.get("cpu_growth_by_target", {}).items():
        extra = f" (ratio of the two medians: {of_medians[gw]:.3f})" if gw in of_medians else ""
        lines.append(
            f"{gw} CPU per request, {max(w['clients'])} clients ÷ {min(w['clients'])} client, median of per-round "
            f"pairs: {v:.3f}{extra}."
        )
    if s.get("chain_vs_plain"):
        lines += [
            "",
            (
                "A healthy chain against the same model without one (gateway-chain-1w ÷ gateway-1w, median of "
                "per-round pairs; 1.00 = no overhead):"
            ),
            "",
        ]
        keys = ("cpu_ms_per_request", "p50_ms", "p99_ms", "req_s")
        chain = [[c, *(f"{v[k]:.3f}×" for k in keys), v["pairs"]] for c, v in s["chain_vs_plain"].items()]
        lines += table(["clients", "CPU per request", "p50", "p99", "req/s", "pairs"], chain)
    return "\n".join(lines) + "\n"
