"""The contestants: the gateway's runtimes and precisions (models of one ``rerank-gateway serve``
process, over loopback HTTP) and the in-process tools (sentence-transformers, ONNX Runtime,
FlashRank). Each one is a ``ScoreFn``.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from benchmarks import harness

OV = {"engine": "openvino"}
LOW = {"parity_min_agreement": 0.001}
# torch's fp32 scores: the top-10 order and score changes are taken against it, and ratios by default.
TORCH = "gateway transformers (fp32)"
GATEWAY_VARIANTS: dict[str, dict[str, Any]] = {  # contestant -> its model entry's keys
    TORCH: {"engine": "transformers", "device": "cpu", "dtype": "float32"},
    "gateway openvino fp32": {**OV, "precision": "fp32"},
    # The same with batches that never mix requests: what shared batches gain at 4 clients.
    "gateway openvino fp32 (per-request batches)": {**OV, "precision": "fp32", "batching": "per-request"},
    # Reduced precisions serve whatever the gate measures (parity_min_agreement lowered), so
    # their speed is reported beside the verdict the default gate (99 %) gives ("gate" column).
    "gateway openvino bf16": {**OV, "precision": "bf16", **LOW},
    "gateway openvino int8": {**OV, "precision": "int8", **LOW},
    # bf16 / int8 for every document, fp32 re-scoring the ones they cannot order in the top-10.
    "gateway openvino bf16 refine10": {**OV, "precision": "bf16", "refine_top": 10, **LOW},
    # Both sides of every open pair at once (refine_rounds = 2, the default, re-scores one side
    # first and looks again): what the rounds save.
    "gateway openvino bf16 refine10 (one round)": {
        **OV,
        "precision": "bf16",
        "refine_top": 10,
        "refine_rounds": 1,
        **LOW,
    },
    "gateway openvino int8 refine10": {**OV, "precision": "int8", "refine_top": 10, **LOW},
}
ScoreFn = Callable[[str, list[str]], list[float]]


class Gateway(harness.Gateway):
    """One ``rerank-gateway serve`` process holding every gateway contestant as a model."""

    def __init__(self, model_dir: Path, work: Path, names: list[str], gate: str = "") -> None:
        self.models = {name: f"m{i}" for i, name in enumerate(names)}
        entries = []
        for name, model in self.models.items():
            # A long timeout: 4 clients of 50 documents queue for minutes on a loaded 2-core machine.
            entry = {"name": model, "path": str(model_dir), "timeout_s": 1800.0, **GATEWAY_VARIANTS[name]}
            if "openvino" in name:
                entry["cache_dir"] = str(work / "ov-cache")
            if gate and "parity_min_agreement" in entry:
                entry["parity_queries"], entry["parity_documents"] = map(int, gate.split("x"))
            entries.append(entry)
        super().__init__("gateway", entries, work)
        self.client = httpx.Client(base_url=self.url, timeout=600.0, limits=httpx.Limits(max_connections=16))

    def wait(self, timeout: float = 1800.0) -> dict[str, str]:
        """Wait until every model is ready or failed three times (a load retried after a passing fault); name -> error of those that failed."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited {self.proc.returncode}")
            states = {m["name"]: m for m in (self.status() or {}).get("models", [])}
            if states and all(
                s["state"] == "ready" or s.get("load_attempts", 0) >= 3 and s["state"] == "failed"
                for s in states.values()
            ):
                return {n: states[m].get("error", "") for n, m in self.models.items() if states[m]["state"] != "ready"}
            time.sleep(1)
        raise TimeoutError("gateway models did not load")

    def describe(self) -> dict[str, dict[str, Any]]:
        models = {m["name"]: m for m in (self.status() or {})["models"]}
        return {n: models[m] for n, m in self.models.items()}

    def engine_stats(self, name: str) -> dict[str, Any]:
        return self.describe()[name].get("engine_stats") or {}

    def scorer(self, name: str) -> ScoreFn:
        model = self.models[name]

        def score(query: str, docs: list[str]) -> list[float]:
            r = self.client.post("/v1/rerank", json={"model": model, "query": query, "documents": docs})
            r.raise_for_status()
            return harness.in_order(r.json()["results"], len(docs))

        return score


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
        torch.onnx.export(
            model,
            example,
            str(fp32),
            input_names=names,
            output_names=["logits"],
            opset_version=17,
            dynamic_axes={n: {0: "batch", 1: "length"} for n in names},
            dynamo=False,
        )
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
            enc = tok(
                [query] * len(docs[i : i + 32]), docs[i : i + 32], padding=True, truncation=True, return_tensors="np"
            )
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
        (local / "special_tokens_map.json").write_text(
            json.dumps({k: cfg[k] for k in keys if isinstance(cfg.get(k), str)})
        )
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
}


class Peer:
    """A sentence-transformers backend in the peers' Python (``peer.py``), one request at a time
    through its pipe: concurrent clients queue, as callers sharing one ``CrossEncoder`` would."""

    def __init__(self, python: str, model_dir: Path, backend: str, ov_config: dict[str, str] | None = None) -> None:
        extra = [json.dumps(ov_config)] if ov_config else []
        self.proc = subprocess.Popen(
            [python, str(Path(__file__).with_name("peer.py")), str(model_dir), backend, *extra],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.pid = self.proc.pid
        self._lock = threading.Lock()
        assert self.proc.stdout is not None
        ready = self.proc.stdout.readline()  # the export and warm-up are done (or it died: "")
        if not ready:
            raise RuntimeError(f"{python} peer.py {backend} exited {self.proc.wait()} before it was ready")
        self.info: dict[str, Any] = json.loads(ready)  # what the peer runs (its inference precision)

    def score(self, query: str, docs: list[str]) -> list[float]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        with self._lock:
            self.proc.stdin.write(json.dumps({"query": query, "documents": docs}) + "\n")
            self.proc.stdin.flush()
            return [float(s) for s in json.loads(self.proc.stdout.readline())]

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# The peers' Python's contestants (``--peers-python``): name -> (sentence-transformers backend,
# OpenVINO config or None for the backend's default).
PEERS: dict[str, tuple[str, dict[str, str] | None]] = {
    # The exact path: fp32 weights computed in fp32 (the hint given, see peer.py).
    "sentence-transformers openvino fp32 (batch 32)": (
        "openvino",
        {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32"},
    ),
    # As a user gets it: the fp32 model, the plugin's precision (bf16 on CPUs that have it).
    "sentence-transformers openvino, default config (batch 32)": ("openvino", None),
    "sentence-transformers onnx fp32 (batch 32)": ("onnx", None),
    # The same protocol on torch: runs in this environment too (no --peers-python), so CI's tiny
    # run covers the peer path.
    "sentence-transformers torch (batch 32, own process)": ("torch", None),
}
