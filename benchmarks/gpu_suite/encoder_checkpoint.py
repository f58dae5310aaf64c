"""The checkpoint and the d100 workload ``benchmarks/gpu_suite/encoders.py`` measures, and its fp32 reference.

XLM-R large's real config (bge-reranker-v2-m3's) and ``--tiny``'s. :func:`build` writes the
tokenizer and the random-weight checkpoint (on CUDA also the bf16 matmul rates) in a child
process, :func:`reference_scores` the probe's fp32 scores in another: the benchmark's own process
never touches CUDA. ModernBERT-base's shape (``encoder_shapes.py``) went on 2026-12-05.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = (
    "DOCS",
    "DOC_TOKENS",
    "QUERY_TOKENS",
    "REAL_CONFIG",
    "TINY_CONFIG",
    "build",
    "flops_per_request",
    "pair_lengths",
    "probe_request",
    "reference_scores",
)

# XLMRobertaForSequenceClassification, bge-reranker-v2-m3's config.json (XLM-R large, 8k positions).
REAL_CONFIG: dict[str, Any] = {
    "vocab_size": 250002,
    "hidden_size": 1024,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "intermediate_size": 4096,
    "hidden_act": "gelu",
    "max_position_embeddings": 8194,
    "type_vocab_size": 1,
    "layer_norm_eps": 1e-5,
    "pad_token_id": 1,
    "bos_token_id": 0,
    "eos_token_id": 2,
    "num_labels": 1,
    "initializer_range": 0.02,
}
TINY_CONFIG: dict[str, Any] = {
    **REAL_CONFIG,
    "vocab_size": 2000,
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 256,
    "max_position_embeddings": 514,
    "initializer_range": 0.2,
}
DOC_TOKENS, QUERY_TOKENS, DOCS = "60-200", "15", 100


_BUILD = r"""
import itertools, json, string, sys, time
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast
from gateway.bench.workload import _WORDS

out, cfg, device = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
# XLM-R's special ids (<s> 0, <pad> 1, </s> 2, <unk> 3, <mask> last); the workload's words whole,
# characters and letter pairs (word starts and continuations) so any text tokenizes, then
# three- and four-letter word starts up to the real vocabulary size.
cls_, pad_, sep_, unk_, mask_ = "<s>", "<pad>", "</s>", "<unk>", "<mask>"
letters = string.ascii_lowercase
chars = [c for c in string.printable if not c.isspace()]
vocab = [(cls_, 0.0), (pad_, 0.0), (sep_, 0.0), (unk_, 0.0), ("\u2581", -6.0)]
vocab += [("\u2581" + w, -5.0) for w in dict.fromkeys(_WORDS)]
vocab += [(c, -10.0) for c in chars] + [("\u2581" + c, -9.0) for c in chars]
vocab += [("".join(p), -11.0) for p in itertools.product(letters, repeat=2)]
seen = {p for p, _ in vocab}
for n in (2, 3, 4):
    for combo in itertools.product(letters, repeat=n):
        if len(vocab) >= cfg["vocab_size"] - 1:
            break
        piece = "\u2581" + "".join(combo)
        if piece not in seen:
            vocab.append((piece, -12.0 - n))
vocab.append((mask_, 0.0))
assert len(vocab) == cfg["vocab_size"], len(vocab)
tok = Tokenizer(models.Unigram(vocab, unk_id=3, byte_fallback=False))
tok.pre_tokenizer = pre_tokenizers.Metaspace()
tok.decoder = decoders.Metaspace()
tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
from transformers import XLMRobertaConfig as Config, XLMRobertaForSequenceClassification as Model
PreTrainedTokenizerFast(tokenizer_object=tok, unk_token=unk_, pad_token=pad_, cls_token=cls_, sep_token=sep_,
                        mask_token=mask_, model_max_length=cfg["max_position_embeddings"] - 2,
                        bos_token="<s>", eos_token="</s>").save_pretrained(out)
torch.manual_seed(0)
on_gpu = device == "cuda"
torch.set_default_dtype(torch.bfloat16 if on_gpu else torch.float32)
with torch.device(device):
    model = Model(Config(**cfg))
model.save_pretrained(out)
rates = {}
if on_gpu:  # the bf16 matmul rate MFU is measured against: square, and the model's GEMMs at 16k tokens
    def rate(m, k, n):
        a, b = torch.randn(m, k, device="cuda"), torch.randn(k, n, device="cuda")
        times = []
        for i in range(30):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record(); a @ b; e1.record(); e1.synchronize()
            if i >= 5:
                times.append(e0.elapsed_time(e1) / 1e3)
        return 2 * m * k * n / sorted(times)[len(times) // 2] / 1e12
    h, i = cfg["hidden_size"], cfg["intermediate_size"]
    rates["square_8192_tflops"] = rate(8192, 8192, 8192)
    shapes = {"qkv": (16384, h, 3 * h), "out": (16384, h, h), "up": (16384, h, i), "down": (16384, i, h)}
    per = {k: rate(*s) for k, s in shapes.items()}
    flops = {k: s[1] * s[2] for k, s in shapes.items()}
    rates["model_gemms_tflops"] = sum(flops.values()) / sum(flops[k] / per[k] for k in per)
    rates["model_gemms_each"] = per
    rates["device"] = torch.cuda.get_device_name(0)
print("RATES " + json.dumps(rates))
"""


def build(out: Path, cfg: dict[str, Any], device: str) -> dict[str, Any]:
    """Tokenizer + checkpoint (+ matmul rates on CUDA), written by a child process."""
    argv = [sys.executable, "-c", _BUILD, str(out), json.dumps(cfg), device]
    proc = subprocess.run(argv, check=True, capture_output=True, text=True)
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RATES "))
    return json.loads(line[6:])


def pair_lengths(model_dir: Path, cfg: dict[str, Any], requests: int = 8) -> list[list[int]]:
    """Token counts of d100 pairs as the gateway builds them (<s> q </s></s> d </s>), from the bench's own workload."""
    import msgspec

    from gateway.bench.workload import WorkloadSpec, build_workload, load_token_counter

    counter = load_token_counter(str(model_dir))
    spec = WorkloadSpec(requests=requests, documents=DOCS, doc_tokens=DOC_TOKENS, query_tokens=QUERY_TOKENS, seed=11)
    out = []
    for r in build_workload(spec, counter):
        body = msgspec.json.decode(r.body)
        (q,) = counter.count([body["query"]])
        out.append([q + d + 4 for d in counter.count(body["documents"])])
    return out


def flops_per_request(cfg: dict[str, Any], pair_lens: list[int]) -> float:
    """2 x non-embedding weights x tokens + bidirectional attention (QK^T and PV: 4 L x keys x d per layer)."""
    h, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    weights = layers * (4 * h * h + 2 * h * cfg["intermediate_size"])
    return 2 * weights * sum(pair_lens) + layers * sum(4 * n * n * h for n in pair_lens)


def probe_request(model_dir: Path) -> tuple[str, list[str]]:
    """One d100 request (its own seed) every runtime scores twice, compared with the fp32 reference."""
    import msgspec

    from gateway.bench.workload import WorkloadSpec, build_workload, load_token_counter

    spec = WorkloadSpec(requests=1, documents=DOCS, doc_tokens=DOC_TOKENS, query_tokens=QUERY_TOKENS, seed=99)
    (r,) = build_workload(spec, load_token_counter(str(model_dir)))
    body = msgspec.json.decode(r.body)
    return body["query"], body["documents"]


_REFERENCE = r"""
import json, sys
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

model_dir, device, query, docs = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
tok = AutoTokenizer.from_pretrained(model_dir)
model = AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
scores = []
with torch.no_grad():
    for i in range(0, len(docs), 25):
        enc = tok([query] * len(docs[i:i + 25]), docs[i:i + 25], padding=True, return_tensors="pt").to(device)
        scores += torch.sigmoid(model(**enc).logits[:, 0].float()).tolist()
print("SCORES " + json.dumps(scores))
"""


def reference_scores(model_dir: Path, device: str, query: str, docs: list[str]) -> list[float]:
    """fp32 scores of the probe request, plain transformers (padded pairs, the tokenizer's own pair encoding)."""
    proc = subprocess.run(
        [sys.executable, "-c", _REFERENCE, str(model_dir), device, query, json.dumps(docs)],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("SCORES "))[7:])
