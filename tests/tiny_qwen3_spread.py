"""The tiny random Qwen3 with its yes/no head rewritten so scores spread as a trained reranker's do.

``build_tiny_qwen3_spread(dir)`` builds tests/tiny_qwen3.py's checkpoint, takes the final hidden
states of the last position of the gate's golden prompts (first queries), and sets the "yes" and
"no" rows of the LM head to +/- a/2 * u, with u the hidden states' first principal direction
(centred on their mean) and a chosen so the margins' 1st..99th percentiles span logit -4.6..4.6:
P(yes) then spans ~0.01..0.99 across documents, instead of 0.5 +/- a few hundredths.

What that does and does not change: a ranking is an order of margins, and an order is invariant
to the head's scale, so the spread alone does not make a quantization keep more orders (the
tests show the gate's outcome on this checkpoint and on the plain one). It makes the scores look
like a reranker's (the gate's largest score change is then measured on the range that matters)
and gives a direction the documents really vary along.
"""

from __future__ import annotations

from pathlib import Path

import torch

from tests.tiny_qwen3 import build_tiny_qwen3


def final_hidden(model: object, prompts: list[list[int]]) -> torch.Tensor:
    """The final-norm hidden state at each prompt's last position (fp32, one prompt at a time: no padding)."""
    with torch.no_grad():
        return torch.stack([model.model(torch.tensor([p])).last_hidden_state[0, -1] for p in prompts])  # type: ignore[attr-defined]


def golden_prompts(tok: object, n_queries: int) -> list[list[int]]:
    from adapters.runtimes.packed import gate
    from schemas.config import DEFAULT_INSTRUCTION

    out = []
    for item in gate.golden_set(n_queries):
        shared = tok.encode_shared(item.query, DEFAULT_INSTRUCTION)  # type: ignore[attr-defined]
        out += [tok.assemble(shared, d) for d in tok.encode_documents(item.documents)]  # type: ignore[attr-defined]
    return out


def build_tiny_qwen3_spread(out_dir: str | Path, n_queries: int = 6) -> Path:
    from transformers import AutoModelForCausalLM

    from adapters.families.qwen3 import Qwen3PromptTokenizer, load_hf_tokenizer

    out = build_tiny_qwen3(out_dir)
    tok = Qwen3PromptTokenizer(load_hf_tokenizer(str(out), None), max_length=512, max_query_tokens=64)
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    x = final_hidden(model, golden_prompts(tok, n_queries)).double()
    mean = x.mean(0)
    u = torch.linalg.svd(x - mean, full_matrices=False).Vh[0]
    u = u - (mean @ u) / (mean @ mean) * mean  # margins centred: x @ u ~ (x - mean) @ u_pca
    margins = x @ u
    lo, hi = torch.quantile(margins, 0.01), torch.quantile(margins, 0.99)
    a = 9.2 / float(hi - lo)
    with torch.no_grad():
        head = model.lm_head.weight
        head[tok.yes_id] = (a / 2 * u).to(head.dtype)
        head[tok.no_id] = (-a / 2 * u).to(head.dtype)
    model.save_pretrained(out)
    return out
