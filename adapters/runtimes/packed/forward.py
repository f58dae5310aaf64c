"""One model replica: a Qwen3 causal LM's loaded weights run packed, without padding.

The prompts of a step are concatenated into one token sequence (``T`` tokens); ``cu`` holds
the cumulative prompt lengths, positions restart at 0 for every prompt (RoPE sees each prompt
as if alone), and attention is causal *within* each prompt only:

- CUDA: varlen flash attention (PyTorch's ``torch.nn.attention.varlen.varlen_attn``, else
  ``flash_attn_varlen_func`` when flash-attn is installed), no padding, no mask tensor;
- CPU (or ``attention = "sdpa"``): one causal ``scaled_dot_product_attention`` per prompt, the
  same kernel and arithmetic transformers' own SDPA path uses for a single unpadded sequence,
  hence exact.

Only the last position of each prompt goes through the last layer's MLP, the final norm and the
two LM-head rows ("no", "yes"). The layer weights are transformers' own Qwen3 modules (the
checkpoint loads with its real code); this file only replaces the sequence plumbing around
them, so it serves any Qwen3ForCausalLM checkpoint, GQA included.

Imported only through ``adapters.registry`` (pulls in torch and transformers).
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ("PackedQwen3Replica", "load_backbone", "pick_attention")

Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, Any, list[int] | None], torch.Tensor]


def load_backbone(path: str, revision: str | None, dtype: torch.dtype, rows: Sequence[int]) -> tuple[Any, torch.Tensor]:
    """The checkpoint's backbone (embeddings, layers, final norm) and the LM-head ``rows`` in fp32, on CPU."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, revision=revision, dtype=dtype)
    model.eval()
    head = model.get_output_embeddings().weight[list(rows)].detach().to(torch.float32).clone()
    backbone = getattr(model, model.base_model_prefix)
    for p in backbone.parameters():
        p.requires_grad_(False)
    return backbone, head


def _varlen_attention() -> tuple[str, Attention] | None:
    """Varlen flash attention from PyTorch (>= 2.10) or flash-attn, whichever is importable."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        varlen_attn = None
    if varlen_attn is not None:
        params = set(inspect.signature(varlen_attn).parameters)
        # torch 2.11 (the GPU image) has window_size but no enable_gqa: KV heads are expanded there.
        gqa = "enable_gqa" in params
        causal_kw: dict[str, Any] = {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}

        def torch_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, max_len: Any,
                         lens: list[int] | None) -> torch.Tensor:
            if not gqa and k.shape[1] != q.shape[1]:
                rep = q.shape[1] // k.shape[1]
                k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            extra = {"enable_gqa": True} if gqa and k.shape[1] != q.shape[1] else {}
            return varlen_attn(q, k, v, cu, cu, max_len, max_len, **causal_kw, **extra)

        return "torch varlen_attn" + ("" if gqa else " (KV heads expanded)"), torch_varlen
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError:
        return None

    def flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, max_len: Any,
              lens: list[int] | None) -> torch.Tensor:
        return flash_attn_varlen_func(q, k, v, cu, cu, max_len, max_len, causal=True)  # GQA native

    return "flash_attn varlen", flash


def _sdpa_per_prompt(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, max_len: Any,
                     lens: list[int] | None) -> torch.Tensor:
    """Exact fallback: causal SDPA over each prompt alone (no T x T mask is ever built)."""
    assert lens is not None
    out = []
    for qi, ki, vi in zip(q.split(lens), k.split(lens), v.split(lens), strict=True):
        # (L, heads, D) -> (1, heads, L, D); GQA by SDPA itself, as transformers does.
        o = F.scaled_dot_product_attention(qi.transpose(0, 1)[None], ki.transpose(0, 1)[None], vi.transpose(0, 1)[None],
                                           is_causal=True, enable_gqa=ki.shape[1] != qi.shape[1])
        out.append(o[0].transpose(0, 1))
    return torch.cat(out)


def pick_attention(choice: str, device: torch.device) -> tuple[str, Attention]:
    if choice == "sdpa" or (choice == "auto" and device.type != "cuda"):
        return "sdpa per prompt", _sdpa_per_prompt
    found = _varlen_attention() if device.type == "cuda" else None
    if found is None:
        if choice == "varlen":
            raise RuntimeError("attention = 'varlen' needs CUDA and torch >= 2.10 (varlen_attn) or flash-attn")
        return "sdpa per prompt", _sdpa_per_prompt
    return found


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class PackedQwen3Replica:
    """The model on one device; ``score`` runs one packed step. Not thread-safe: one worker uses it."""

    def __init__(self, backbone: Any, head: torch.Tensor, device: torch.device, *, attention: str, compile: bool) -> None:
        self.device = device
        self.backbone = backbone.to(device)
        self.head = head.to(device)
        self.attention_name, self._attend = pick_attention(attention, device)
        self._per_prompt = self._attend is _sdpa_per_prompt
        self.compiled = compile
        # The scheduler overlaps the host side of step k+1 with step k on the device (CUDA only:
        # on CPU "launch" already computes, and overlapping would only delay delivery).
        self.pipelined = device.type == "cuda"
        self.compile_error: str | None = None
        self._run: Callable[..., torch.Tensor] = self._forward
        if compile:
            import torch._dynamo

            # One compiled graph per replica and per specialization (one prompt vs several).
            torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
            self._run = torch.compile(self._forward, dynamic=True)

    @classmethod
    def replicas(cls, backbone: Any, head: torch.Tensor, devices: Sequence[torch.device], **kw: Any) -> list[PackedQwen3Replica]:
        """One replica per device; every replica but the last gets its own copy of the weights."""
        out = []
        for i, dev in enumerate(devices):
            out.append(cls(backbone if i == len(devices) - 1 else copy.deepcopy(backbone), head, dev, **kw))
        return out

    def warm_up(self, batches: Sequence[Sequence[Sequence[int]]]) -> None:
        """Run ``batches`` now so compilation happens before traffic; an uncompilable graph falls back to eager."""
        try:
            for batch in batches:
                self.score(batch)
        except Exception as exc:
            if not self.compiled:
                raise
            self.compile_error = f"{type(exc).__name__}: {exc}"[:500]
            self.compiled, self._run = False, self._forward
            for batch in batches:
                self.score(batch)

    def score(self, prompts: Sequence[Sequence[int]]) -> list[float]:
        """P(yes) over {no, yes} at the last position of each prompt."""
        return self.collect(self.launch(prompts))

    @torch.inference_mode()
    def launch(self, prompts: Sequence[Sequence[int]]) -> tuple[torch.Tensor, int]:
        """Prepare the step on the host and queue its kernels; on CUDA this returns before they ran."""
        n = len(prompts)
        if self.compiled and n == 1:
            # dynamic=True still specializes a size of 1: a 1-token second prompt keeps one graph.
            prompts = [prompts[0], prompts[0][-1:]]
        lens = [len(p) for p in prompts]
        flat = [t for p in prompts for t in p]
        lens_t = torch.tensor(lens, dtype=torch.int32)
        cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
        torch.cumsum(lens_t, 0, out=cu[1:])
        positions = torch.arange(len(flat), dtype=torch.long) - torch.repeat_interleave(cu[:-1].long(), lens_t.long())
        host = torch.stack((torch.tensor(flat, dtype=torch.long), positions))
        dev = self.device
        if dev.type != "cuda":
            return self._run(host[0], host[1], cu, max(lens), lens if self._per_prompt else None), n
        with torch.cuda.device(dev):  # this worker thread launches on its own GPU
            ids_pos = host.pin_memory().to(dev, non_blocking=True)
            cu_d = cu.pin_memory().to(dev, non_blocking=True)
            return self._run(ids_pos[0], ids_pos[1], cu_d, max(lens), lens if self._per_prompt else None), n

    def collect(self, handle: tuple[torch.Tensor, int]) -> list[float]:
        probs, n = handle
        return probs[:n].tolist()  # waits for the device

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, cu: torch.Tensor, max_len: int,
                 lens: list[int] | None) -> torch.Tensor:
        bb = self.backbone
        n_tokens = ids.shape[0]
        h = bb.embed_tokens(ids)
        cos, sin = bb.rotary_emb(h, positions[None])  # (1, T, D), whatever RoPE scaling the config has
        cos, sin = cos[0, :, None, :], sin[0, :, None, :]
        last = cu[1:].long() - 1
        n_layers = len(bb.layers)
        for i, layer in enumerate(bb.layers):
            a = layer.self_attn
            x = layer.input_layernorm(h)
            q = a.q_norm(a.q_proj(x).view(n_tokens, -1, a.head_dim))
            k = a.k_norm(a.k_proj(x).view(n_tokens, -1, a.head_dim))
            v = a.v_proj(x).view(n_tokens, -1, a.head_dim)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            o = self._attend(q, k, v, cu, max_len, lens)
            h = h + a.o_proj(o.reshape(n_tokens, -1))
            if i == n_layers - 1:
                h = h[last]  # nothing after this attention mixes positions: keep the scored ones
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        logits = bb.norm(h).float() @ self.head.T  # (prompts, 2): [no, yes]
        return torch.softmax(logits, dim=-1)[:, 1]
