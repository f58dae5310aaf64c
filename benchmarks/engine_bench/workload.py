"""The requests every variant gets (d100, d300; fresh ones per salt), their whole prompts' token
counts, and what one prompt costs in model FLOPs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from gateway.bench.workload import WorkloadSpec, build_workload, load_token_counter
from schemas.config import DEFAULT_INSTRUCTION

# name -> (documents, doc tokens, sequential reps, requests per client at 16 clients)
WORKLOADS: dict[str, tuple[int, str, int, int]] = {"d100": (100, "50-150", 10, 4), "d300": (100, "150-450", 6, 2)}
SMALL_WORKLOADS: dict[str, tuple[int, str, int, int]] = {"d100": (10, "20-40", 3, 1), "d300": (10, "40-80", 2, 1)}
CLIENTS = 16
WARMUP = 2

Request = tuple[str, list[str]]
ScoreFn = Callable[[Request], Awaitable[list[float]]]


def make_requests(model_dir: str, name: str, count: int, small: bool = False, salt: int = 0) -> list[Request]:
    """Fresh requests per ``salt``: each variant gets its own, so no prefix cache carries over."""
    docs, doc_tokens, _, _ = (SMALL_WORKLOADS if small else WORKLOADS)[name]
    spec = WorkloadSpec(
        requests=count,
        documents=docs,
        doc_tokens=doc_tokens,
        query_tokens="10",
        seed={"d100": 100, "d300": 300}[name] + 7919 * salt,
    )
    out = []
    for r in build_workload(spec, load_token_counter(model_dir)):
        body = msgspec.json.decode(r.body)
        out.append((body["query"], body["documents"]))
    return out


def flops_per_prompt(length: int, cfg: dict[str, Any]) -> float:
    """Forward FLOPs of one prompt: 2 x non-embedding weights x tokens + causal attention."""
    d_attn = cfg["num_attention_heads"] * cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    d_kv = cfg["num_key_value_heads"] * cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    h, f, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    per_layer = h * d_attn + 2 * h * d_kv + d_attn * h + 3 * h * f
    return 2 * per_layer * layers * length + 2 * d_attn * length * (length + 1) * layers


class PromptLengths:
    """Whole-prompt token counts (template + instruction + query + document + suffix)."""

    def __init__(self, model_dir: str) -> None:
        from adapters.families.qwen3 import Qwen3PromptTokenizer, load_hf_tokenizer

        self.tok = Qwen3PromptTokenizer(load_hf_tokenizer(model_dir), max_length=8192, max_query_tokens=2048)

    def of(self, req: Request) -> list[int]:
        shared = len(self.tok.encode_shared(req[0], DEFAULT_INSTRUCTION))
        return [shared + len(ids) + self.tok.suffix_length for ids in self.tok.encode_documents(req[1])]

    def shared(self, req: Request) -> int:
        return len(self.tok.encode_shared(req[0], DEFAULT_INSTRUCTION))
