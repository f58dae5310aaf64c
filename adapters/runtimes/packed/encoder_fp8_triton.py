"""Triton kernels for the cross-encoders' FP8 regions (:mod:`.encoder_fp8`): one pass over a row each.

As :mod:`.fp8_triton` does for Qwen3's: one program per token, the row loaded once, the region's
arithmetic in registers with the torch reference's bf16 roundings, then the row's amax, the e4m3
values and the scale stored -- the quantization costs no second pass over memory.

- ``ln_q``: ``LayerNorm((delta + bias) + h)`` (mean and variance in fp32, as torch's kernel), rows
  whose ``real`` is false zeroed, the result stored (the residual stream) and quantized;
- ``act_q``: ``act(up + bias)`` for GELU (erf or tanh form) or ReLU, quantized.

Not bit-exact to torch (its LayerNorm reduces in another order; its erf is another polynomial):
the picker (``fp8.pick_each``) keeps them only as correct as the reference (``fp8.REGION_EXCESS``), and the
tests check them under Triton's interpreter (``tests/fp8_triton_check.py --encoders``).

Imported lazily by :func:`.encoder_fp8.candidates` on CUDA (Triton is a CUDA-image dependency).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import triton
import triton.language as tl

from adapters.runtimes.packed.fp8_triton import quantize_row

__all__ = ("ACTS", "build")

_E4M3 = torch.float8_e4m3fn
# hidden_act -> the kernel's ACT: 0 exact (erf) GELU, 1 tanh GELU, 2 ReLU
ACTS = {"gelu": 0, "gelu_new": 1, "gelu_pytorch_tanh": 1, "gelu_fast": 1, "relu": 2}


def _ln_q(
    D,
    B,
    X,
    W,
    LB,
    REAL,
    H,
    Q,
    S,
    stride_d,
    stride_x,
    stride_h,
    stride_q,
    N,
    eps,
    BLOCK: tl.constexpr,
    RECIP: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    d = tl.load(D + row * stride_d + cols, mask=mask, other=0.0)
    b = tl.load(B + cols, mask=mask, other=0.0)
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0)
    # the model dtype's roundings of the torch reference: (delta + bias), then + h
    s = (d.to(tl.float32) + b.to(tl.float32)).to(d.dtype)
    s = (s.to(tl.float32) + x.to(tl.float32)).to(d.dtype).to(tl.float32)
    mean = tl.sum(s, axis=0) / N
    c = tl.where(mask, s - mean, 0.0)
    var = tl.sum(c * c, axis=0) / N
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    lb = tl.load(LB + cols, mask=mask, other=0.0).to(tl.float32)
    y = c * tl.math.rsqrt(var + eps) * w + lb
    real = tl.load(REAL + row).to(tl.int32)
    y = tl.where(real != 0, y, 0.0).to(d.dtype)
    tl.store(H + row * stride_h + cols, y, mask=mask)
    yf = y.to(tl.float32)
    q, scale = quantize_row(yf, RECIP)
    tl.store(Q + row * stride_q + cols, q.to(Q.dtype.element_ty), mask=mask)
    tl.store(S + row, scale)


def _act_q(U, B, Q, S, stride_u, stride_q, N, ACT: tl.constexpr, BLOCK: tl.constexpr, RECIP: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    u = tl.load(U + row * stride_u + cols, mask=mask, other=0.0)
    b = tl.load(B + cols, mask=mask, other=0.0)
    x = (u.to(tl.float32) + b.to(tl.float32)).to(u.dtype).to(tl.float32)
    if ACT == 0:
        y = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
    elif ACT == 1:  # tanh(z) = 1 - 2 / (exp(2z) + 1): no tanh in every Triton version
        z = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        y = 0.5 * x * (2.0 - 2.0 / (tl.exp(2.0 * z) + 1.0))
    else:
        y = tl.maximum(x, 0.0)
    yf = y.to(u.dtype).to(tl.float32)
    q, scale = quantize_row(yf, RECIP)
    tl.store(Q + row * stride_q + cols, q.to(Q.dtype.element_ty), mask=mask)
    tl.store(S + row, scale)


def _cfg(n: int, warps: int | None, recip: bool) -> dict[str, int]:
    block = triton.next_power_of_2(n)
    return {"BLOCK": block, "num_warps": warps or max(1, min(16, block // 512)), "RECIP": int(recip)}


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def build(
    hidden_act: str, recip: bool = False, warps: int | None = None
) -> tuple[Callable[..., Any], Callable[..., Any] | None]:
    """(ln_q, act_q) with the signatures of :mod:`.encoder_fp8`'s torch regions; act_q None for an
    activation without a kernel here. Under ``TRITON_INTERPRET=1`` they run on CPU tensors.

    ``recip``: each value multiplied by ``448 / amax`` instead of divided by the scale. A correctly
    rounded division per value made the activation kernel instruction-bound on the H100 (erf GELU +
    ``div_rn`` over a 4096-wide row: 125 us for 14.9k tokens, twice its memory time); the product
    may round a value on an e4m3 boundary the other way, which the picker's error rule allows.
    ``warps``: the programs' warps (default: one per 512 values). The picker times the variants."""
    ln_k, act_k = triton.jit(_ln_q), triton.jit(_act_q)

    def _out(x: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (
            torch.empty(x.shape[0], n, dtype=_E4M3, device=x.device),
            torch.empty(x.shape[0], 1, dtype=torch.float32, device=x.device),
        )

    def ln_q(
        delta: torch.Tensor,
        bias: torch.Tensor,
        h: torch.Tensor,
        w: torch.Tensor,
        b: torch.Tensor,
        eps: float,
        real: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        delta, h = _rows(delta), _rows(h)
        n = h.shape[1]
        q, s = _out(h, n)
        out = torch.empty_like(h)
        ln_k[(h.shape[0],)](
            delta,
            bias,
            h,
            w,
            b,
            real.reshape(-1),
            out,
            q,
            s,
            delta.stride(0),
            h.stride(0),
            out.stride(0),
            q.stride(0),
            n,
            eps,
            **_cfg(n, warps, recip),
        )
        return out, q, s

    if hidden_act not in ACTS:
        return ln_q, None
    code = ACTS[hidden_act]

    def act_q(up: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        up = _rows(up)
        n = up.shape[1]
        q, s = _out(up, n)
        act_k[(up.shape[0],)](up, bias, q, s, up.stride(0), q.stride(0), n, ACT=code, **_cfg(n, warps, recip))
        return q, s

    return ln_q, act_q
