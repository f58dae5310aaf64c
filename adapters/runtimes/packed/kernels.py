"""The packed forward's pointwise kernels: the regions between the GEMMs, and their timing.

The pointwise regions (RMSNorm + residual, q/k norm + RoPE, silu·mul) are plain torch that
``torch.compile`` fuses, with vLLM's fused kernels as alternatives that :mod:`.picks` checks and
times at start (:func:`median_ms`, the FP8 picks' timer too). Kept apart from the replica so a
reader sees the model's arithmetic in one place and its kernels in another; attention, the other
kernel between the GEMMs, is :mod:`.varlen`.

Imported only through ``adapters.registry`` (pulls in torch).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

__all__ = (
    "add_rms",
    "median_ms",
    "qkv_rope",
    "rms",
    "rotate_half",
    "silu_mul",
    "vllm_qk_norm_rope",
    "vllm_silu_mul",
)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


# -- the pointwise regions between GEMMs (compiled one by one in "regions" mode) -------------------
# Same arithmetic as transformers' Qwen3RMSNorm / apply_rotary_pos_emb / Qwen3MLP, so fp32 parity holds.


def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.to(torch.float32)
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(x.dtype)


def add_rms(h: torch.Tensor, delta: torch.Tensor, w: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual add fused with the next norm: one pass over ``h`` instead of three."""
    h = h + delta
    return h, rms(h, w, eps)


def qkv_rope(
    qkv: torch.Tensor,
    qw: torch.Tensor,
    kw: torch.Tensor,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    heads: int,
    kv_heads: int,
    dim: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split the fused projection, per-head q/k norms, RoPE; contiguous (T, heads, dim) outputs for the kernel."""
    n = qkv.shape[0]
    q, k, v = qkv.split((heads * dim, kv_heads * dim, kv_heads * dim), dim=-1)
    q = rms(q.reshape(n, heads, dim), qw, eps)
    k = rms(k.reshape(n, kv_heads, dim), kw, eps)
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    return q.contiguous(), k.contiguous(), v.reshape(n, kv_heads, dim).contiguous()


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def vllm_silu_mul() -> Callable[[torch.Tensor], torch.Tensor] | None:
    """vLLM's CUDA ``silu_and_mul`` (same [gate, up] layout), when vLLM's compiled ops load."""
    try:
        import vllm._C_stable_libtorch  # noqa: F401  # registers torch.ops._C

        op = torch.ops._C.silu_and_mul
    except Exception:  # noqa: BLE001  # no vLLM (or not its CUDA build): the compiled region serves
        return None

    def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
        out = torch.empty(gate_up.shape[0], gate_up.shape[1] // 2, dtype=gate_up.dtype, device=gate_up.device)
        op(out, gate_up)
        return out

    return silu_mul


def vllm_qk_norm_rope() -> Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None:
    """vLLM's CUDA ``fused_qk_norm_rope`` (q/k RMSNorm + NeoX RoPE in place on the fused projection)."""
    try:
        import vllm._C_stable_libtorch  # noqa: F401

        op = torch.ops._C.fused_qk_norm_rope
    except Exception:  # noqa: BLE001
        return None

    def qk_norm_rope(
        qkv: torch.Tensor,
        qw: torch.Tensor,
        kw: torch.Tensor,
        eps: float,
        positions: torch.Tensor,
        cos_sin: torch.Tensor,
        heads: int,
        kv_heads: int,
        dim: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        op(qkv, heads, kv_heads, kv_heads, dim, eps, qw, kw, cos_sin, True, positions, -1)
        n = qkv.shape[0]
        q, k, v = qkv.split((heads * dim, kv_heads * dim, kv_heads * dim), dim=-1)
        # Views with the projection's row stride: the varlen kernels take them as they are.
        return q.view(n, heads, dim), k.view(n, kv_heads, dim), v.view(n, kv_heads, dim)

    return qk_norm_rope


def median_ms(fn: Callable[[], Any], n: int = 10) -> float:
    fn()
    times = []
    for _ in range(n):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[n // 2]
