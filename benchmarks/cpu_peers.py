"""Contestants of ``benchmarks.cpu_encoders`` that need packages the project does not depend on:
Infinity (``infinity-emb``, torch engine) and CTranslate2. Both run in a separate interpreter
(``--peers-python``, a venv of their own: Infinity pins sentence-transformers < 4 and
transformers < 5, which would replace the project's) as server processes on loopback, so the
benchmark measures them as it measures the gateway: HTTP requests, docs/s, and the CPU-seconds
of the serving process.

- Infinity: ``infinity_emb v2 --engine torch --device cpu --dtype float32`` on the local
  checkpoint, its /rerank endpoint (sigmoid scores, its default), its default batch size (32),
  torch.compile off (its default); BetterTransformer is its default but needs optimum, which is
  not installed, so plain transformers attention runs.
- CTranslate2: the checkpoint converted by ctranslate2's transformers converter (fp32); int8 is
  the same conversion loaded with ``compute_type="int8"`` (weights quantized at load).
  ``ctranslate2.Encoder`` returns hidden states and BERT's pooler output but no classifier: this
  file applies the checkpoint's classification head in numpy (BERT: ``classifier`` on the pooler
  output; XLM-R: ``classifier.dense`` + tanh + ``classifier.out_proj`` on the <s> state). The
  server below tokenizes with the checkpoint's tokenizer and scores in batches of 32 in input
  order (sentence-transformers' batch), one encoder, ctranslate2's default threads.

This file runs twice: imported by the benchmark (stdlib only at the top, the peers venv has
neither msgspec nor the gateway), and as ``python -m benchmarks.cpu_peers convert|serve`` under
the peers interpreter. Its ``check`` (each peer's largest raw-logit difference to transformers
fp32, answered in cpu-2026-12-01-peers) was removed on 2026-12-05.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.harness import ROOT, Proc, free_port, in_order

INFINITY = "Infinity (torch engine, fp32, batch 32)"
CT2 = {"CTranslate2 fp32 (batch 32)": "float32", "CTranslate2 int8 (batch 32)": "int8"}
PEERS = [INFINITY, *CT2]
# No telemetry, no hub: the machine reaches no hub and a user benchmarking offline sets the same.
OFFLINE = {
    "DO_NOT_TRACK": "1",
    "INFINITY_ANONYMOUS_USAGE_STATS": "0",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}


def peer_checkpoint(model_dir: Path, work: Path) -> Path:
    """The checkpoint as transformers 4.x reads it. transformers 5 saves a tokenizer as
    ``"tokenizer_class": "TokenizersBackend"``, a name 4.x does not know; without the key 4.x
    picks the fast tokenizer of config.json's model type from the same tokenizer.json, as it
    does for a checkpoint from the hub. Weights are links, not copies."""
    out = work / "peer-checkpoint"
    if out.exists():
        return out
    out.mkdir(parents=True)
    for f in model_dir.iterdir():
        if f.is_file():
            (out / f.name).symlink_to(f.resolve())
    cfg = json.loads((model_dir / "tokenizer_config.json").read_text())
    if cfg.get("tokenizer_class") == "TokenizersBackend":
        del cfg["tokenizer_class"]
        (out / "tokenizer_config.json").unlink()
        (out / "tokenizer_config.json").write_text(json.dumps(cfg))
    return out


class PeerServer(Proc):
    """One server process under the peers interpreter, and an HTTP client to it; ``setup`` says how it runs."""

    def __init__(self, name: str, cmd: list[str], work: Path, port: int, setup: str) -> None:
        import httpx

        super().__init__(cmd, work / f"{name.split()[0].lower()}-{port}.log", env=OFFLINE)
        self.pid, self.setup = self.proc.pid, setup
        self.url = f"http://127.0.0.1:{port}"
        self.client = httpx.Client(base_url=self.url, timeout=600.0, limits=httpx.Limits(max_connections=16))


def start_infinity(
    model_dir: Path, work: Path, python: str
) -> tuple[PeerServer, Callable[[str, list[str]], list[float]]]:
    port = free_port()
    # Infinity's own console script next to the interpreter, as a user runs it.
    # Its warm-up (batches of 512-token pairs, minutes for XLM-R base on 2 cores) only logs
    # timings, nothing it serves with uses them; the benchmark warms every contestant alike.
    flags = "--engine torch --device cpu --dtype float32 --host 127.0.0.1 --log-level warning --no-model-warmup"
    checkpoint = str(peer_checkpoint(model_dir, work))
    cmd = [str(Path(python).parent / "infinity_emb"), "v2", "--model-id", checkpoint, "--served-model-name", "peer"]
    cmd += [*flags.split(), "--port", str(port)]
    server = PeerServer(
        INFINITY,
        cmd,
        work,
        port,
        "infinity_emb v2 --engine torch --device cpu --dtype float32 (batch size: its default, 32; "
        "torch.compile: its default, off; BetterTransformer: its default, on, but inert without optimum)",
    )

    def score(query: str, docs: list[str]) -> list[float]:
        r = server.client.post("/rerank", json={"model": "peer", "query": query, "documents": docs})
        r.raise_for_status()
        return in_order(r.json()["results"], len(docs))

    return server, score


def convert_ct2(model_dir: Path, work: Path, python: str) -> Path:
    """The checkpoint converted once per shape (fp32), under the peers interpreter; raises with the
    converter's last line when ctranslate2 cannot convert it."""
    out = work / "ct2"
    if not (out / "model.bin").exists():
        done = subprocess.run(
            [python, "-m", "benchmarks.cpu_peers", "convert", str(peer_checkpoint(model_dir, work)), str(out)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            env={**os.environ, **OFFLINE},
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError("converter: " + (done.stderr.strip().splitlines() or ["no output"])[-1][:300])
    return out


def start_ct2(
    model_dir: Path, work: Path, python: str, compute_type: str
) -> tuple[PeerServer, Callable[[str, list[str]], list[float]]]:
    ct2_dir, port = convert_ct2(model_dir, work, python), free_port()
    name = next(n for n, c in CT2.items() if c == compute_type)
    cmd = [python, "-m", "benchmarks.cpu_peers", "serve", str(peer_checkpoint(model_dir, work)), str(ct2_dir)]
    cmd += ["--compute-type", compute_type, "--port", str(port)]
    server = PeerServer(
        name,
        cmd,
        work,
        port,
        f"ctranslate2.Encoder(compute_type={compute_type!r}, default threads) behind a stdlib HTTP server; "
        "batches of 32 in input order; classifier head in numpy",
    )

    def score(query: str, docs: list[str]) -> list[float]:
        r = server.client.post("/score", json={"query": query, "documents": docs})
        r.raise_for_status()
        return r.json()["scores"]

    return server, score


def start_peer(
    name: str, model_dir: Path, work: Path, python: str
) -> tuple[PeerServer, Callable[[str, list[str]], list[float]]]:
    server, score = (
        start_infinity(model_dir, work, python) if name == INFINITY else start_ct2(model_dir, work, python, CT2[name])
    )
    try:
        server.wait_http(server.url + "/health", timeout=900.0)
    except BaseException:
        server.stop()
        raise
    return server, score


# -- under the peers interpreter --------------------------------------------------------------
def _convert(checkpoint: str, out: str) -> None:
    from ctranslate2.converters import TransformersConverter
    from ctranslate2.converters import transformers as ct2t

    base = ct2t._MODEL_LOADERS["XLMRobertaConfig"].__class__

    class XLMRobertaPadded(base):  # type: ignore[misc,valid-type]
        """The converter checks vocabulary size == embedding rows; the tiny test tokenizer has
        fewer tokens than the 250,002-row embedding of the real shape (a real checkpoint's
        tokenizer has them all). Placeholders fill the rest, as ctranslate2's BertLoader does;
        the server feeds token ids, so the strings are never read."""

        def get_vocabulary(self, model: Any, tokenizer: Any) -> list[str]:
            tokens = super().get_vocabulary(model, tokenizer)
            return tokens + [f"<extra_id_{i}>" for i in range(model.config.vocab_size - len(tokens))]

    ct2t._MODEL_LOADERS["XLMRobertaConfig"] = XLMRobertaPadded()
    TransformersConverter(checkpoint).convert(out, force=True)


def _serve(checkpoint: str, ct2_dir: str, compute_type: str, port: int) -> None:
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import ctranslate2
    import numpy as np
    from safetensors import safe_open
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(checkpoint)
    encoder = ctranslate2.Encoder(ct2_dir, device="cpu", compute_type=compute_type)
    with safe_open(str(Path(checkpoint) / "model.safetensors"), "np") as f:
        w = {k: f.get_tensor(k).astype(np.float32) for k in f.keys() if k.startswith("classifier.")}  # noqa: SIM118 -- safe_open, not a dict
    keys = sorted(w)

    def head(out: Any) -> np.ndarray:
        if "classifier.weight" in w:  # BertForSequenceClassification: Linear(pooler_output)
            return np.asarray(out.pooler_output) @ w["classifier.weight"].T + w["classifier.bias"]
        cls = np.asarray(out.last_hidden_state)[:, 0]  # XLMRobertaClassificationHead on <s>
        x = np.tanh(cls @ w["classifier.dense.weight"].T + w["classifier.dense.bias"])
        return x @ w["classifier.out_proj.weight"].T + w["classifier.out_proj.bias"]

    def score(query: str, docs: list[str], raw: bool) -> list[float]:
        scores: list[float] = []
        for i in range(0, len(docs), 32):
            enc = tok([query] * len(docs[i : i + 32]), docs[i : i + 32], truncation=True)
            types = enc.get("token_type_ids")
            out = encoder.forward_batch(
                enc["input_ids"], token_type_ids=types if types and any(map(any, types)) else None
            )
            logits = head(out)[:, 0]
            scores += (logits if raw else 1 / (1 + np.exp(-logits))).tolist()
        return scores

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the other servers

        def _send(self, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._send({"compute_type": encoder.compute_type, "head": keys})

        def do_POST(self) -> None:
            req = json.loads(self.rfile.read(int(self.headers["content-length"])))
            self._send({"scores": score(req["query"], req["documents"], bool(req.get("raw_scores")))})

        def log_message(self, *args: Any) -> None:
            pass

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


def main() -> None:
    p = argparse.ArgumentParser(description="CTranslate2 side of benchmarks.cpu_encoders (runs under --peers-python)")
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("convert")
    c.add_argument("checkpoint")
    c.add_argument("out")
    s = sub.add_parser("serve")
    s.add_argument("checkpoint")
    s.add_argument("ct2_dir")
    s.add_argument("--compute-type", default="float32")
    s.add_argument("--port", type=int, required=True)
    args = p.parse_args()
    if args.cmd == "convert":
        _convert(args.checkpoint, args.out)
    else:
        _serve(args.checkpoint, args.ct2_dir, args.compute_type, args.port)


if __name__ == "__main__":
    sys.exit(main())
