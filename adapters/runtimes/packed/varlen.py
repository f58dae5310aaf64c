"""Attention over a packed step: the varlen kernels, their exact per-sequence fallbacks, and their checks.

Attention on CUDA is the first of vLLM's FlashAttention-3 (native GQA), flash-attn and PyTorch's
``varlen_attn`` that imports; on CPU one SDPA per prompt (exact). Causal for the decoder
rerankers, bidirectional (``causal=False``) for the encoder cross-encoders (``encoder.py``). Query and key sequences
may differ in length (a document's tail attends to its request's shared prefix and itself): the
causal mask is then aligned bottom-right, as the flash kernels define it (flash-attn >= 2.1, FA3,
PyTorch's flash op), and :func:`bottom_right_error` checks a kernel does so before it is trusted.
``window`` (bidirectional only: ModernBERT's local layers) limits each query to the keys within
``window`` positions of it, both sides inclusive: the flash kernels' ``window_size=(window, window)``,
a band mask in the per-sequence SDPA.

Apart from :mod:`.kernels` (the pointwise regions between the GEMMs): each replica picks its
attention here once, at start, from what the machine has; the picking, the wrappers that give
every kernel one signature (:data:`Attention`) and the checks a kernel passes before it serves
belong together, and none of them is the arithmetic between the GEMMs.

Imported only through ``adapters.registry`` (pulls in torch).
"""

from __future__ import annotations

import functools
import inspect
import itertools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

__all__ = (
    "PER_SEQUENCE",
    "Attention",
    "band_error",
    "bottom_right_error",
    "needs_lengths",
    "pick_attention",
    "sdpa_per_prompt",
    "sdpa_per_sequence",
)

# (q, k, v, cu_seqlens_q, cu_seqlens_k, max_q, max_k, lens_q, lens_k) -> (tokens_q, heads, dim);
# the host lists of lengths are given to the per-prompt SDPA only (None for the varlen kernels).
Attention = Callable[
    [
        torch.Tensor,
        torch.Tensor,
        torch.Tensor,
        torch.Tensor,
        torch.Tensor,
        Any,
        Any,
        list[int] | None,
        list[int] | None,
    ],
    torch.Tensor,
]


def _fa3_attention(causal: bool = True, window: int | None = None) -> Attention | None:
    """vLLM's FlashAttention-3 varlen kernel (Hopper; GQA native), when vLLM is importable and has it."""
    try:
        from vllm.vllm_flash_attn import flash_attn_varlen_func
        from vllm.vllm_flash_attn.flash_attn_interface import is_fa_version_supported

        if not is_fa_version_supported(3):
            return None
    except Exception:  # noqa: BLE001  # no vLLM, no FA3 build, or not a Hopper GPU: another kernel
        return None

    def fa3(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu_q: torch.Tensor,
        cu_k: torch.Tensor,
        max_q: Any,
        max_k: Any,
        lens_q: list[int] | None,
        lens_k: list[int] | None,
    ) -> torch.Tensor:
        return flash_attn_varlen_func(q, k, v, max_q, cu_q, max_k, cu_k, causal=causal, fa_version=3, **band)

    band = _window_kw(window)
    return fa3


def _window_kw(window: int | None) -> dict[str, Any]:
    """The flash kernels' ``window_size`` for a bidirectional band of ``window`` keys each side (left, right; inclusive)."""
    if window is None:
        return {}
    if window < 0:
        raise ValueError(f"window {window}: a band needs a width >= 0")
    return {"window_size": (window, window)}


def _torch_varlen(causal: bool = True, window: int | None = None) -> Attention | None:
    """PyTorch's (>= 2.10) ``varlen_attn``."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    params = set(inspect.signature(varlen_attn).parameters)
    # torch 2.11 (the GPU image) has window_size but no enable_gqa: KV heads are expanded there.
    gqa = "enable_gqa" in params
    # window_size (-1, 0): nothing after the query position; (-1, -1): the whole sequence.
    if window is not None:  # a band (bidirectional): only where the signature has window_size
        if causal or "window_size" not in params:
            return None
        causal_kw: dict[str, Any] = _window_kw(window)
    elif "window_size" in params:
        causal_kw = {"window_size": (-1, 0) if causal else (-1, -1)}
    else:
        causal_kw = {"is_causal": causal}

    # window_size (-1, 0) / is_causal reach aten._flash_attention_forward, FA2's kernel: bottom-right
    # aligned when a key sequence is longer (torch.nn.attention.bias relies on the same for LOWER_RIGHT).
    def torch_varlen(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu_q: torch.Tensor,
        cu_k: torch.Tensor,
        max_q: Any,
        max_k: Any,
        lens_q: list[int] | None,
        lens_k: list[int] | None,
    ) -> torch.Tensor:
        if not gqa and k.shape[1] != q.shape[1]:
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        extra = {"enable_gqa": True} if gqa and k.shape[1] != q.shape[1] else {}
        # The encoders hand strided q/k/v views of the fused projection (no-op when contiguous).
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        return varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, **causal_kw, **extra)

    torch_varlen.gqa = gqa  # type: ignore[attr-defined]
    return torch_varlen


def _flash_attn(causal: bool = True, window: int | None = None) -> Attention | None:
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError:
        return None

    def flash(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu_q: torch.Tensor,
        cu_k: torch.Tensor,
        max_q: Any,
        max_k: Any,
        lens_q: list[int] | None,
        lens_k: list[int] | None,
    ) -> torch.Tensor:
        return flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=causal, **band)  # GQA native

    band = _window_kw(window)
    return flash


def _varlen_attention(
    kernel: str = "auto", causal: bool = True, window: int | None = None
) -> tuple[str, Attention] | None:
    """The first importable varlen kernel of: vLLM's FA3 (GQA native), flash-attn, PyTorch's ``varlen_attn``.

    FA3 first: on the H200 it was the fastest (docs/benchmarks/gpu-h200-2026-12-01-b) and needs
    no KV-head expansion; torch 2.11's ``varlen_attn`` runs FA2 kernels and lacks GQA.
    """
    for name, make in (("fa3", _fa3_attention), ("flash_attn", _flash_attn), ("torch", _torch_varlen)):
        if kernel not in ("auto", name):
            continue
        fn = make(causal, window)
        if fn is not None:
            label = {
                "fa3": "vLLM FlashAttention-3 varlen",
                "flash_attn": "flash_attn varlen",
                "torch": "torch varlen_attn",
            }[name]
            if name == "torch" and not getattr(fn, "gqa", False):
                label += " (KV heads expanded)"
            return label + _window_label(window), fn
    return None


def _window_label(window: int | None) -> str:
    return "" if window is None else f", window ±{window}"


def sdpa_per_sequence(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    max_q: Any,
    max_k: Any,
    lens_q: list[int] | None,
    lens_k: list[int] | None,
    window: int | None = None,
) -> torch.Tensor:
    """Exact fallback for encoders: bidirectional SDPA over each sequence alone (no padding).

    ``window``: query i sees keys j with |i - j| <= window (a band mask, built only for a sequence
    longer than the band, as transformers' bidirectional sliding-window mask).
    """
    assert lens_q is not None and lens_k is not None
    out = []
    for qi, ki, vi in zip(q.split(lens_q), k.split(lens_k), v.split(lens_k), strict=True):
        n = qi.shape[0]
        mask = None
        if window is not None and n > window + 1:
            pos = torch.arange(n, device=q.device)
            mask = (pos[:, None] - pos[None, :]).abs() <= window
        o = F.scaled_dot_product_attention(
            qi.transpose(0, 1)[None],
            ki.transpose(0, 1)[None],
            vi.transpose(0, 1)[None],
            attn_mask=mask,
            enable_gqa=ki.shape[1] != qi.shape[1],
        )
        out.append(o[0].transpose(0, 1))
    return torch.cat(out)


def sdpa_per_prompt(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    max_q: Any,
    max_k: Any,
    lens_q: list[int] | None,
    lens_k: list[int] | None,
) -> torch.Tensor:
    """Exact fallback: causal SDPA over each sequence alone (no T x T mask is ever built).

    A query sequence shorter than its keys (a tail after its shared prefix) gets the bottom-right
    mask built here: SDPA's ``is_causal`` is top-left when L != S, which would hide the prefix.
    """
    assert lens_q is not None and lens_k is not None
    out = []
    for qi, ki, vi in zip(q.split(lens_q), k.split(lens_k), v.split(lens_k), strict=True):
        lq, lk = qi.shape[0], ki.shape[0]
        # bottom-right: query i sees keys 0 .. lk - lq + i
        mask = None if lq == lk else torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril(lk - lq)
        # (L, heads, D) -> (1, heads, L, D); GQA by SDPA itself, as transformers does.
        o = F.scaled_dot_product_attention(
            qi.transpose(0, 1)[None],
            ki.transpose(0, 1)[None],
            vi.transpose(0, 1)[None],
            attn_mask=mask,
            is_causal=mask is None,
            enable_gqa=ki.shape[1] != qi.shape[1],
        )
        out.append(o[0].transpose(0, 1))
    return torch.cat(out)


def bottom_right_error(attend: Attention, device: torch.device, dtype: torch.dtype) -> float:
    """Relative error of ``attend`` against an fp32 SDPA reference on sequences whose keys outnumber
    their queries (bottom-right causal): ~1e-3 in bf16 for a right kernel, ~1 for a top-left one."""
    g = torch.Generator(device="cpu").manual_seed(0)
    lens_q, lens_k = [5, 3, 17, 1], [5, 9, 40, 12]
    heads, kv_heads, dim = 4, 2, 64
    q = torch.randn(sum(lens_q), heads, dim, generator=g)
    k, v = (torch.randn(sum(lens_k), kv_heads, dim, generator=g) for _ in range(2))
    want = []
    for qi, ki, vi in zip(q.split(lens_q), k.split(lens_k), v.split(lens_k), strict=True):
        lq, lk = qi.shape[0], ki.shape[0]
        allowed = torch.arange(lk)[None, :] <= torch.arange(lq)[:, None] + (lk - lq)
        s = torch.einsum("qhd,khd->hqk", qi, ki.repeat_interleave(heads // kv_heads, dim=1)) / dim**0.5
        p = s.masked_fill(~allowed, float("-inf")).softmax(-1)
        want.append(torch.einsum("hqk,khd->qhd", p, vi.repeat_interleave(heads // kv_heads, dim=1)))
    ref = torch.cat(want)
    cu_q, cu_k = (
        torch.tensor([0, *itertools.accumulate(n)], dtype=torch.int32, device=device) for n in (lens_q, lens_k)
    )
    got = (
        attend(
            q.to(device, dtype),
            k.to(device, dtype),
            v.to(device, dtype),
            cu_q,
            cu_k,
            max(lens_q),
            max(lens_k),
            lens_q,
            lens_k,
        )
        .float()
        .cpu()
    )
    return ((got - ref).norm() / ref.norm()).item()


def band_error(attend: Attention, device: torch.device, dtype: torch.dtype, window: int) -> float:
    """Relative error of a banded ``attend`` against the fp32 per-sequence SDPA with the same band
    (itself checked against a dense mask in tests/test_packed_modernbert.py), on sequences shorter
    and several times longer than the band: ~3e-3 in bf16 for a right kernel, ~1 for one that
    ignores or misplaces the window."""
    g = torch.Generator(device="cpu").manual_seed(0)
    lens = [1, window, 3 * window + 5, 2, 2 * window + 1]
    q, k, v = (torch.randn(sum(lens), 4, 64, generator=g) for _ in range(3))
    ref = sdpa_per_sequence(q, k, v, None, None, None, None, lens, lens, window=window)
    cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device=device)
    got = (
        attend(q.to(device, dtype), k.to(device, dtype), v.to(device, dtype), cu, cu, max(lens), max(lens), lens, lens)
        .float()
        .cpu()
    )
    return ((got - ref).norm() / ref.norm()).item()


# The per-sequence fallbacks need the host-side lengths (``lens_q``/``lens_k``); the varlen kernels only ``cu``.
PER_SEQUENCE: frozenset[Attention] = frozenset({sdpa_per_prompt, sdpa_per_sequence})


def needs_lengths(attend: Attention) -> bool:
    """Whether ``attend`` is a per-sequence fallback (a banded one is a partial of it): it needs the host lengths."""
    return getattr(attend, "func", attend) in PER_SEQUENCE


def pick_attention(
    choice: str,
    device: torch.device,
    kernel: str = "auto",
    *,
    causal: bool = True,
    dtype: torch.dtype | None = None,
    window: int | None = None,
) -> tuple[str, Attention]:
    """``kernel`` ("auto", "fa3", "flash_attn", "torch") narrows which varlen kernel may serve.

    ``causal=False``: bidirectional within each sequence (encoders). ``dtype`` float32: the
    varlen kernels take half precision only, so "auto" keeps the exact per-sequence SDPA.
    ``window`` (with ``causal=False``): each query sees the keys within ``window`` positions of
    it, both sides (ModernBERT's local layers); a kernel without ``window_size`` is passed over.
    """
    if window is not None and causal:
        raise ValueError("a window is for bidirectional attention (causal=False)")
    if causal:
        fallback: tuple[str, Attention] = ("sdpa per prompt", sdpa_per_prompt)
    elif window is None:
        fallback = ("sdpa per sequence", sdpa_per_sequence)
    else:
        fallback = ("sdpa per sequence" + _window_label(window), functools.partial(sdpa_per_sequence, window=window))
    if choice == "sdpa" or (choice == "auto" and (device.type != "cuda" or dtype == torch.float32)):
        return fallback
    found = _varlen_attention(kernel, causal, window) if device.type == "cuda" else None
    if found is None:
        if choice == "varlen":
            raise RuntimeError(
                "attention = 'varlen' needs CUDA and vLLM's FA3, flash-attn or torch >= 2.10 (varlen_attn)"
            )
        return fallback
    return found
