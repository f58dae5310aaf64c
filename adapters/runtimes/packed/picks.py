"""Start-time kernel choices of a packed replica (Qwen3; ModernBERT's local window), each checked before it is used.

A candidate kernel is first run on random data against the region it would replace: one that
does not compute the same function is never used. The ones that do are timed on a d100 step's
shapes (16k tokens) and the faster wins. ``forward.PackedQwen3Replica`` calls these at warm-up
(``sharing_error``, ``pick_silu_mul``, ``pick_qk_norm_rope``) and after FP8 quantization
(``pick_fp8_regions``), and keeps what they return; ``modernbert_forward`` checks its local layers'
varlen kernel with ``window_error``.

Imported only through the packed replicas (pulls in torch).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from adapters.runtimes.packed import fp8, kernels, varlen

__all__ = ("on_device", "pick_fp8_regions", "pick_qk_norm_rope", "pick_silu_mul", "sharing_error", "window_error")


def on_device(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """``device`` as the current CUDA device (kernels that launch on the current one land there); nothing off CUDA."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


@torch.inference_mode()
def sharing_error(attend: varlen.Attention, name: str, device: torch.device, dtype: torch.dtype) -> str | None:
    """Why prefixes cannot be shared with ``attend``, or None where they can.

    Tails attend to [P; T_i]: a kernel whose causal mask is top-left there would hide the prefix."""
    try:
        with on_device(device):
            err = varlen.bottom_right_error(attend, device, dtype)
    except Exception as exc:  # noqa: BLE001  # a kernel that refuses seqlen_q != seqlen_k
        return f"{name}: {type(exc).__name__}: {exc}"[:300]
    if not err < 2e-2:  # bf16: ~3e-3; a top-left mask: ~1
        return f"{name}: not bottom-right aligned (relative error {err:.3g})"
    return None


@torch.inference_mode()
def window_error(
    attend: varlen.Attention, name: str, device: torch.device, dtype: torch.dtype, window: int
) -> str | None:
    """Why ``attend`` (a varlen kernel given ``window_size=(window, window)``) cannot serve local
    attention, or None where it computes the band: a build without local-attention kernels
    raises, one that ignores the window is off by ~1."""
    try:
        with on_device(device):
            err = varlen.band_error(attend, device, dtype, window)
    except Exception as exc:  # noqa: BLE001  # e.g. a kernel build without sliding-window support
        return f"{name}: {type(exc).__name__}: {exc}"[:300]
    if not err < 2e-2:  # bf16: ~3e-3
        return f"{name}: not the band (relative error {err:.3g})"
    return None


def pick_silu_mul(
    op: Callable[[torch.Tensor], torch.Tensor], current: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor
) -> tuple[Callable[[torch.Tensor], torch.Tensor] | None, dict[str, Any] | None]:
    """vLLM's silu_and_mul ``op`` where it computes silu(gate) * up and beats ``current`` on ``x``
    (else None), and the timings (None: nothing measured, the op computes something else).

    Inductor's kernel ran at ~1.5 TB/s on the H200, vLLM's ~3x faster (docs/benchmarks/gpu-h200-2026-12-01-b)."""
    try:
        if (op(x[:64]).float() - kernels.silu_mul(x[:64]).float()).abs().max().item() < 0.05:
            timing = {"compiled": kernels.median_ms(lambda: current(x)), "vllm": kernels.median_ms(lambda: op(x))}
            return (op if timing["vllm"] < timing["compiled"] else None), timing
    except Exception as exc:  # noqa: BLE001  # keep the compiled region
        return None, {"error": f"{type(exc).__name__}: {exc}"[:200]}
    return None, None


def pick_qk_norm_rope(
    op: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    region: Callable[..., Any],
    w: Any,
    eps: float,
    dim: int,
    rotary_emb: Any,
    cos_sin_cache: Callable[[int], torch.Tensor],
    device: torch.device,
) -> tuple[Callable[..., Any] | None, dict[str, Any]]:
    """vLLM's fused q/k norm + RoPE ``op`` where it computes ``region``'s q, k, v (layer ``w``'s
    shapes, ``rotary_emb``'s RoPE) and is faster (else None), and the relative error / timings."""
    try:
        n = 16384
        qkv = torch.randn(n, w.qkv.shape[0], dtype=w.qkv.dtype, device=device)
        pos = torch.arange(n, device=device) % 300
        cos_sin = cos_sin_cache(300)
        cos, sin = rotary_emb(qkv[:, :dim], pos[None])
        cos, sin = cos[0, :, None, :], sin[0, :, None, :]
        want = region(qkv, w.q_norm, w.k_norm, eps, cos, sin, w.heads, w.kv_heads, dim)
        got = op(qkv.clone(), w.q_norm, w.k_norm, eps, pos, cos_sin, w.heads, w.kv_heads, dim)
        err = max(((a.float() - b.float()).norm() / b.float().norm()).item() for a, b in zip(got, want, strict=True))
        if not err < 1e-2:
            return None, {"rel_err": err}
        timing = {
            "compiled": kernels.median_ms(
                lambda: region(qkv, w.q_norm, w.k_norm, eps, cos, sin, w.heads, w.kv_heads, dim)
            ),
            "vllm": kernels.median_ms(lambda: op(qkv, w.q_norm, w.k_norm, eps, pos, cos_sin, w.heads, w.kv_heads, dim)),
            "rel_err": err,
        }
        return (op if timing["vllm"] < timing["compiled"] else None), timing
    except Exception as exc:  # noqa: BLE001
        return None, {"error": f"{type(exc).__name__}: {exc}"[:200]}


@torch.inference_mode()
def pick_fp8_regions(
    cands: dict[str, dict[str, Any]], w: Any, eps: float, device: torch.device, dtype: torch.dtype, choice: str = "auto"
) -> tuple[fp8.Regions, dict[str, Any]]:
    """Each quantizing region's kernel among ``cands`` (``fp8.candidates``): the fastest on a
    16k-token step's shapes (layer ``w``'s, quantized) that computes fp8.REFERENCE's result; per
    region the kernel picked and each candidate's error / ms. ``choice`` prefers one family."""
    cuda = device.type == "cuda"
    inputs = fp8.region_inputs(
        16384 if cuda else 64, w.ln1.shape[0], w.f8[2].out_features // 2, w.f8[1].qt.shape[0], w.ln2, device, dtype
    )
    with on_device(device):
        return fp8.pick_regions(cands, inputs, eps, kernels.median_ms if cuda else None, choice)
