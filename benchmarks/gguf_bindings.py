"""llama.cpp bindings for the ``gguf`` runtime, side by side: llama-cpp-python vs xllamacpp.

``python -m benchmarks.gguf_bindings --out DIR --lcp-python PY --xll-python PY`` (issue 21 item 6):

1. builds, offline, a tiny random Qwen3 reranker (``tests/tiny_qwen3.py``), a wider one (hidden
   512: enough compute that threading shows; F32, the tiny one also Q8_0), the tiny XLM-R cross-encoder
   (``tests/tiny_gguf.py``); the Qwen3 ones are converted by llama.cpp's own
   ``convert_hf_to_gguf.py`` (from llama-cpp-python's sdist, ``--converter``);
2. scores each file with each binding in its own child process (the two libraries export the
   same ``llama_*`` symbols; one process each keeps them apart), rounds interleaved A B A B:
   - ``lcp``: the gateway's real runtime, :class:`adapters.runtimes.gguf.GgufEngine` on
     llama-cpp-python (tokenization in the gateway, one ``llama_decode`` per batch);
   - ``xll``: xllamacpp's ``Server.handle_rerank`` (llama.cpp's server in-process: its own prompt
     layout, tokenizer and slot batching; texts in, the first rank output out);
3. compares every score with the transformers reference (``tests/reference.py`` for Qwen3, a
   plain ``XLMRobertaForSequenceClassification`` forward + sigmoid for XLM-R).

Writes ``DIR/gguf_bindings.json`` and ``DIR/README.md``. Install times are measured apart
(fresh venvs, ``time pip install``) and passed in with ``--install KEY=SECONDS``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

QUERIES = ["what is the capital of the united states", "how do i change my password", "qubits in quantum computing"]
_SENTENCES = [
    "Carson City is the capital city of the American state of Nevada.",
    "Washington, D.C. is the capital of the United States. It is a federal district.",
    "Capital punishment has existed in the United States since before it was a country.",
    "Quantum computing uses qubits. Text rerank models are widely used in search engines.",
    "Click Settings, then Security, then Change password to set a new one.",
    "The capital of France is Paris. Berlin is the capital of Germany. Madrid is in Spain.",
]


def documents(n: int = 24) -> list[str]:
    """``n`` documents of 1 to 8 sentences (about 15 to 130 tokens), the same every run."""
    return [" ".join(_SENTENCES[(i + k) % len(_SENTENCES)] for k in range(1 + i % 8)) for i in range(n)]


# -- setup (parent: needs torch, transformers, gguf) --------------------------------------------


def setup(work: Path, converter: Path) -> dict[str, dict[str, Any]]:
    from tests.llama_convert import convert, qwen3_reranker_checkpoint
    from tests.tiny_gguf import build_tiny_xlmr, write_gguf
    from tests.tiny_qwen3 import build_tiny_qwen3

    tiny = build_tiny_qwen3(work / "tiny-qwen3")
    models: dict[str, dict[str, Any]] = {}
    for hidden in (128, 512):
        hf = qwen3_reranker_checkpoint(tiny, work / f"qwen3-reranker-h{hidden}", hidden=hidden)
        for outtype in ("f32", "q8_0") if hidden == 128 else ("f32",):
            path = convert(converter, hf, work / f"qwen3-h{hidden}-{outtype}.gguf", outtype=outtype)
            models[f"qwen3-h{hidden}-{outtype}"] = {"hf": str(hf), "kind": "qwen3", "path": str(path)}
    xlmr = build_tiny_xlmr(work / "tiny-xlmr")
    models["xlmr-h64-f32"] = {"hf": str(xlmr), "kind": "xlmr", "path": str(write_gguf(xlmr, work / "xlmr-f32.gguf"))}
    return models


def references(models: dict[str, dict[str, Any]], docs: list[str]) -> dict[str, dict[str, list[float]]]:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from tests import reference

    out: dict[str, dict[str, list[float]]] = {}
    for name, m in models.items():
        if m["kind"] == "qwen3":
            out[name] = {q: reference.score_texts(m["hf"], q, docs) for q in QUERIES}
        else:
            tok = AutoTokenizer.from_pretrained(m["hf"])
            model = AutoModelForSequenceClassification.from_pretrained(m["hf"], dtype=torch.float32).eval()
            with torch.inference_mode():
                out[name] = {
                    q: [torch.sigmoid(model(**tok(q, d, return_tensors="pt")).logits[0, 0]).item() for d in docs]
                    for q in QUERIES
                }
    return out


# -- children ------------------------------------------------------------------------------------


def _child_lcp(path: str, docs: list[str], reps: int, threads: int, max_length: int | None) -> dict[str, Any]:
    import anyio

    from adapters.base import ScoreJob
    from adapters.runtimes.gguf import GgufEngine
    from schemas.config import GgufEngineConfig

    async def main() -> dict[str, Any]:
        t0 = time.perf_counter()
        # max_length also sizes llama.cpp's context: n_ctx = n_batch = max(batch_tokens, window).
        sized = {} if max_length is None else {"max_length": max_length, "batch_tokens": max_length}
        cfg = GgufEngineConfig(name="g", path=path, n_threads=threads, **sized)
        engine = GgufEngine(cfg)
        await engine.start()
        load = time.perf_counter() - t0

        async def rank(q: str) -> list[float]:
            tok = engine.tokenizer
            assert tok is not None
            job = ScoreJob(
                query=q, instruction="", shared_ids=tok.encode_shared(q, ""), item_ids=tok.encode_documents(docs)
            )
            return list((await engine.score(job)).scores)

        scores = {q: await rank(q) for q in QUERIES}  # also the warm-up
        t0 = time.perf_counter()
        for _ in range(reps):
            for q in QUERIES:
                await rank(q)
        elapsed = time.perf_counter() - t0
        await engine.stop()
        return {"scores": scores, "load_s": load, "elapsed_s": elapsed}

    return anyio.run(main)


def _child_xll(path: str, docs: list[str], reps: int, threads: int, kind: str) -> dict[str, Any]:
    import xllamacpp as xlc

    t0 = time.perf_counter()
    p = xlc.CommonParams()
    p.model.path = path
    p.embedding = True
    p.pooling_type = xlc.llama_pooling_type.LLAMA_POOLING_TYPE_RANK
    # As the gateway's runtime: one 8192-token batch, up to 64 prompts in it (shared KV cells).
    p.n_ctx = p.n_batch = p.n_ubatch = 8192
    p.n_parallel = 64
    p.kv_unified = True
    p.cpuparams.n_threads = p.cpuparams_batch.n_threads = threads
    p.verbosity = 0
    server = xlc.Server(p)
    load = time.perf_counter() - t0

    def rank(q: str) -> list[float]:
        res = server.handle_rerank({"query": q, "documents": docs})
        if "error" in res:
            raise RuntimeError(res["error"])
        got = {r["index"]: r["relevance_score"] for r in res["results"]}
        # The server returns the first rank output as is: P(yes) for Qwen3, the raw logit for XLM-R.
        return [got[i] if kind == "qwen3" else 1 / (1 + math.exp(-got[i])) for i in range(len(docs))]

    scores = {q: rank(q) for q in QUERIES}
    t0 = time.perf_counter()
    for _ in range(reps):
        for q in QUERIES:
            rank(q)
    elapsed = time.perf_counter() - t0
    return {"scores": scores, "load_s": load, "elapsed_s": elapsed}


def child_main(argv: list[str]) -> None:
    binding, path, kind, reps, threads = argv[0], argv[1], argv[2], int(argv[3]), int(argv[4])
    max_length = int(argv[5]) if len(argv) > 5 and argv[5] != "none" else None
    docs = documents()
    if binding == "lcp":
        out = _child_lcp(path, docs, reps, threads, max_length)
    else:
        out = _child_xll(path, docs, reps, threads, kind)
    sys.stdout.write("\nRESULT " + json.dumps(out) + "\n")


def _run_child(
    python: str, binding: str, model: dict[str, Any], reps: int, threads: int, max_length: int | None = None
) -> dict[str, Any]:
    cmd = [
        python,
        "-m",
        "benchmarks.gguf_bindings",
        "--child",
        binding,
        model["path"],
        model["kind"],
        str(reps),
        str(threads),
        str(max_length).lower(),
    ]
    proc = subprocess.run(
        cmd, check=False, capture_output=True, text=True, timeout=900, cwd=Path(__file__).resolve().parents[1]
    )
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise RuntimeError(f"{binding} child failed ({proc.returncode}): {proc.stderr[-2000:]}")


def _order(xs: list[float]) -> list[int]:
    return sorted(range(len(xs)), key=lambda i: -xs[i])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child_main(sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=Path("/tmp/gguf-bindings"))
    ap.add_argument("--converter", type=Path, required=True, help="llama.cpp checkout (vendor/llama.cpp of the sdist)")
    ap.add_argument("--lcp-python", required=True, help="python with llama-cpp-python")
    ap.add_argument("--xll-python", required=True, help="python with xllamacpp")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3, help="repetitions of the 3 queries x 24 documents per round")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--lcp-max-length", type=int, default=None, help="GgufEngine max_length = batch_tokens (default: 8192)"
    )
    ap.add_argument("--models", default="", help="comma-separated subset of the model names")
    ap.add_argument("--install", action="append", default=[], help="KEY=SECONDS measured apart")
    args = ap.parse_args()

    docs = documents()
    models = setup(args.work, args.converter)
    if args.models:
        models = {k: v for k, v in models.items() if k in args.models.split(",")}
    refs = references(models, docs)
    pythons = {"lcp": args.lcp_python, "xll": args.xll_python}
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {m: {"lcp": [], "xll": []} for m in models}
    load0 = os.getloadavg()
    for rnd in range(args.rounds):
        for name, model in models.items():
            order = ["lcp", "xll"] if rnd % 2 == 0 else ["xll", "lcp"]
            for b in order:
                runs[name][b].append(_run_child(pythons[b], b, model, args.reps, args.threads, args.lcp_max_length))
    n_scored = args.reps * len(QUERIES) * len(docs)
    summary: dict[str, Any] = {}
    for name in models:
        summary[name] = {}
        for b in ("lcp", "xll"):
            first = runs[name][b][0]["scores"]
            diff = max(abs(a - r) for q in QUERIES for a, r in zip(first[q], refs[name][q], strict=True))
            same_order = all(_order(first[q]) == _order(refs[name][q]) for q in QUERIES)
            top10 = all(_order(first[q])[:10] == _order(refs[name][q])[:10] for q in QUERIES)
            rates = [n_scored / r["elapsed_s"] for r in runs[name][b]]
            summary[name][b] = {
                "max_abs_diff_vs_transformers": diff,
                "same_order": same_order,
                "same_top10": top10,
                "docs_per_s_median": statistics.median(rates),
                "docs_per_s_runs": rates,
                "load_s_median": statistics.median(r["load_s"] for r in runs[name][b]),
            }
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores (shared); load average before {load0}, after {os.getloadavg()}",
        "workload": f"{len(QUERIES)} queries x {len(docs)} documents (15-130 tokens), {args.reps} reps per round, {args.rounds} rounds interleaved, {args.threads} threads, GgufEngine max_length = batch_tokens = {args.lcp_max_length or 'default (8192)'}",
        "install_s": dict(kv.rsplit("=", 1) for kv in args.install),
        "models": {k: {"kind": v["kind"], "file": Path(v["path"]).name} for k, v in models.items()},
        "summary": summary,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gguf_bindings.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        f"# llama.cpp bindings for the gguf runtime ({report['date']})",
        "",
        f"Machine: {report['machine']}. Workload: {report['workload']}.",
        "",
        "| model | binding | max abs diff vs transformers | same order | docs/s (median) | load s |",
        "|---|---|---|---|---|---|",
    ]
    for name, per in summary.items():
        for b, s in per.items():
            lines.append(
                f"| {name} | {'llama-cpp-python (GgufEngine)' if b == 'lcp' else 'xllamacpp (handle_rerank)'} | "
                f"{s['max_abs_diff_vs_transformers']:.1e} | {s['same_order']} | {s['docs_per_s_median']:.0f} | {s['load_s_median']:.2f} |"
            )
    if report["install_s"]:
        lines += [
            "",
            "Install (fresh venv, `time pip install`): "
            + ", ".join(f"{k} {v} s" for k, v in report["install_s"].items()),
        ]
    (args.out / "README.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
