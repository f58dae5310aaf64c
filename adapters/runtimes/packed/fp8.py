"""FP8 (e4m3) for the packed Qwen3 forward: the quantizing regions and how their kernels are picked.

The weights and GEMMs are :mod:`.fp8_gemm`'s. Activations are quantized per token (row), inside
the pointwise region that produces them (RMSNorm, silu·mul), so the quantization costs no extra
pass over memory: on the H200 separate
quantization kernels cost 9.8 ms of a d100 step's 15.2 ms of FP8 GEMMs (issue 24), and Inductor's
compiled regions still left the FP8 step slower than bf16 (docs/benchmarks/gpu-h200-2026-12-01-c).
Each region therefore has several kernels -- the torch functions below compiled by Inductor, one
Triton kernel per region (:mod:`.fp8_triton`), vLLM's fused ops -- and :func:`pick_regions` keeps,
per region, the fastest that computes the torch functions' result (timed on the model's shapes).
Attention, norms, RoPE, the residual stream and the LM-head rows stay in the model's dtype.

Imported only through ``adapters.registry`` (pulls in torch).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from adapters.runtimes.packed import kernels
from adapters.runtimes.packed.fp8_gemm import E4M3, quantize_rows

__all__ = (
    "REGION_EXCESS",
    "add_rms_q",
    "candidates",
    "pick_each",
    "pick_regions",
    "quant",
    "region_error",
    "rms_q",
    "silu_mul_q",
)

# -- pointwise regions that end in a quantization (compiled one by one, like kernels.rms etc.) ----
# Each rounds to the model dtype first, as the bf16 path would hand the GEMM its input.


def rms_q(x: torch.Tensor, w: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return quantize_rows(kernels.rms(x, w, eps))


def add_rms_q(
    h: torch.Tensor, delta: torch.Tensor, w: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    h, x = kernels.add_rms(h, delta, w, eps)
    return (h, *quantize_rows(x))


def silu_mul_q(gate_up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return quantize_rows(kernels.silu_mul(gate_up))


def quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The attention output: FA3 is opaque to Inductor, so this one is its own (small) kernel."""
    return quantize_rows(x)


# -- picking each region's kernel at start -----------------------------------------------------------
# The regions' tuple everywhere: (rms_q, add_rms_q, silu_mul_q, quant). "norm" covers the first two
# (one kernel family, timed on add_rms_q: 55 of a 28-layer step's 57 norms).

Regions = tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any], Callable[..., Any]]
REFERENCE: Regions = (rms_q, add_rms_q, silu_mul_q, quant)
# A kernel is correct when its dequantized output is as close to the exact values (float64, not
# quantized) as the torch functions' own output is, within REGION_EXCESS: it may round in another
# (equally valid) order, never lose more. Compared with the torch functions' output directly, two
# correct kernels differ by ~1.5e-2 relative where one rounds the normalized value to bf16 before
# quantizing and the other does not (Inductor's compiled region, vLLM's fused op: 1.47e-2 and
# 1.44e-2 on the H200, 2026-12-05; 1.47e-2 on the CPU) -- a whole e4m3 step for ~1/32 of the
# values -- while the unrounded one is 0.4 % *closer* to the exact values. A wrong scale is ~37x
# farther (a kernel storing twice its scale: +3,700 %), a wrong layout or weight likewise.
REGION_EXCESS = 0.05
RESIDUAL_TOL = 1e-2  # the "norm" region's residual stream (h + delta in bf16): no quantization in it


def triton_regions(recip: bool = False) -> Regions | None:
    """The Triton kernels (:mod:`.fp8_triton`; ``recip``: its reciprocal-scale variant) when Triton
    imports; compiled on first call."""
    try:
        from adapters.runtimes.packed import fp8_triton

        return fp8_triton.build(recip)
    except Exception:  # noqa: BLE001  # no Triton in this install
        return None


def vllm_regions() -> dict[str, Any]:
    """vLLM's fused FP8 ops, those this build has: {"norm": (rms_q, add_rms_q), "silu_mul": {name: fn}, "quant": fn}.

    ``rms_norm_dynamic_per_token_quant`` adds the residual in place (``h`` becomes ``h + delta``,
    which the forward reassigns anyway). vLLM 0.26 has no silu·mul with a per-token scale (its
    ``silu_and_mul_quant`` takes a static scale, ``silu_and_mul_per_block_quant`` 64/128-wide
    groups: a whole row as one group is off its label, and a kernel that faults leaves the CUDA
    context unusable, so it is not tried): ``silu_and_mul`` then the per-token quant, two passes.
    """
    try:
        from vllm import _custom_ops  # noqa: F401  # registers torch.ops._C

        try:
            import vllm._C_stable_libtorch  # noqa: F401  # silu_and_mul lives here in some builds
        except ImportError:
            pass
        ops = torch.ops._C
    except Exception:  # noqa: BLE001  # no vLLM, or not its CUDA build
        return {}

    def _out(x: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (
            torch.empty(x.shape[0], n, dtype=E4M3, device=x.device),
            torch.empty(x.shape[0], 1, dtype=torch.float32, device=x.device),
        )

    found: dict[str, Any] = {}
    if hasattr(ops, "rms_norm_dynamic_per_token_quant"):

        def v_rms_q(x: torch.Tensor, w: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
            q, s = _out(x, x.shape[1])
            ops.rms_norm_dynamic_per_token_quant(q, x.contiguous(), w, s, eps, None, None)
            return q, s

        def v_add_rms_q(h: torch.Tensor, delta: torch.Tensor, w: torch.Tensor, eps: float) -> tuple[torch.Tensor, ...]:
            q, s = _out(h, h.shape[1])
            ops.rms_norm_dynamic_per_token_quant(q, delta.contiguous(), w, s, eps, None, h)
            return h, q, s

        found["norm"] = (v_rms_q, v_add_rms_q)
    if hasattr(ops, "dynamic_per_token_scaled_fp8_quant"):

        def v_quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            q, s = _out(x, x.shape[1])
            ops.dynamic_per_token_scaled_fp8_quant(q, x.contiguous(), s, None)
            return q, s

        found["quant"] = v_quant
        silu: dict[str, Any] = {}
        if hasattr(ops, "silu_and_mul"):

            def v_silu_then_quant(gate_up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
                y = torch.empty(gate_up.shape[0], gate_up.shape[1] // 2, dtype=gate_up.dtype, device=gate_up.device)
                ops.silu_and_mul(y, gate_up)
                return v_quant(y)

            silu["vLLM silu_and_mul + per-token quant"] = v_silu_then_quant
        found["silu_mul"] = silu
    return found


def candidates(compiled: bool, cuda: bool) -> dict[str, dict[str, Any]]:
    """Per region ("norm", "silu_mul", "quant"), the kernels this process has, by name."""
    out: dict[str, dict[str, Any]] = {"norm": {}, "silu_mul": {}, "quant": {}}
    if compiled:
        c = tuple(torch.compile(f, dynamic=True) for f in REFERENCE)
        out["norm"]["compiled (Inductor)"] = (c[0], c[1])
        out["silu_mul"]["compiled (Inductor)"], out["quant"]["compiled (Inductor)"] = c[2], c[3]
    else:
        out["norm"]["eager"] = REFERENCE[:2]
        out["silu_mul"]["eager"], out["quant"]["eager"] = REFERENCE[2], REFERENCE[3]
    if not cuda:
        return out
    for suffix, recip in (("", False), (", reciprocal", True)):
        t = triton_regions(recip)
        if t is not None:
            out["norm"]["triton" + suffix] = t[:2]
            out["silu_mul"]["triton" + suffix], out["quant"]["triton" + suffix] = t[2], t[3]
    v = vllm_regions()
    if "norm" in v:
        out["norm"]["vLLM rms_norm_dynamic_per_token_quant"] = v["norm"]
    out["silu_mul"].update(v.get("silu_mul", {}))
    if "quant" in v:
        out["quant"]["vLLM dynamic_per_token_scaled_fp8_quant"] = v["quant"]
    return out


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double(), want.double()
    return ((got - want).norm() / want.norm().clamp_min(1e-30)).item()


def _exact(region: str, inputs: dict[str, torch.Tensor], eps: float) -> list[torch.Tensor]:
    """The region's outputs in float64, not quantized (what a kernel's dequantized output approximates)."""

    def rms64(x: torch.Tensor) -> torch.Tensor:
        x = x.double()
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * inputs["w"].double()

    if region == "norm":
        h, delta = inputs["h"], inputs["delta"]
        return [rms64(h), rms64(h + delta)]  # the residual as the bf16 stream holds it
    if region == "silu_mul":
        gate, up = inputs["gate_up"].double().chunk(2, dim=-1)
        return [torch.nn.functional.silu(gate) * up]
    return [inputs["o"].double()]


def region_error(region: str, fn: Any, inputs: dict[str, torch.Tensor], eps: float) -> dict[str, float]:
    """How a kernel's results compare: ``rel_err``, its largest relative difference from the torch
    functions' (dequantized values); ``excess``, how much farther from the exact values it is than
    they are (0 for the torch functions themselves; a kernel is correct up to :data:`REGION_EXCESS`).
    For "norm" the residual stream must equal theirs (``RESIDUAL_TOL``), else ``excess`` is inf."""

    def deq(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return q.double() * s.double()

    exact = _exact(region, inputs, eps)
    if region == "norm":
        h, delta, w = inputs["h"], inputs["delta"], inputs["w"]
        want_h, *want_add = add_rms_q(h, delta, w, eps)
        got_h, *got_add = fn[1](h.clone(), delta, w, eps)  # a clone: vLLM's op adds in place
        got = [deq(*fn[0](h, w, eps)), deq(*got_add)]
        want = [deq(*rms_q(h, w, eps)), deq(*want_add)]
        residual = _rel(got_h, want_h)
    else:
        x = inputs["gate_up"] if region == "silu_mul" else inputs["o"]
        ref = silu_mul_q if region == "silu_mul" else quant
        got, want, residual = [deq(*fn(x))], [deq(*ref(x))], 0.0
    excess = max(_rel(g, e) / max(_rel(r, e), 1e-30) - 1 for g, r, e in zip(got, want, exact, strict=True))
    if not residual <= RESIDUAL_TOL:
        excess = math.inf
    return {"rel_err": max(_rel(g, r) for g, r in zip(got, want, strict=True)), "excess": excess}


def _correct(row: dict[str, Any]) -> bool:
    return "excess" in row and row["excess"] <= REGION_EXCESS  # nan fails too


def pick_each(
    cands: dict[str, dict[str, Any]],
    error: Callable[[str, Any], dict[str, float]],
    call: Callable[[str, Any], Callable[[], Any]],
    timer: Callable[[Callable[[], Any]], float] | None,
    choice: str = "auto",
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Per region of ``cands`` the fastest correct kernel (``error(region, fn)``: a row as
    :func:`region_error` gives, correct up to :data:`REGION_EXCESS`; ``timer(call(region, fn)) -> ms``);
    the rules of :func:`pick_regions`, for any set of regions (Qwen3's here, the encoders' in
    :mod:`.encoder_fp8`)."""
    picked: dict[str, Any] = {}
    info: dict[str, Any] = {}
    for region, named in cands.items():
        rows: dict[str, dict[str, Any]] = {}
        for name, fn in named.items():
            try:
                rows[name] = dict(error(region, fn))
            except Exception as exc:  # noqa: BLE001  # a kernel this GPU or build lacks
                rows[name] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
                continue
            if not _correct(rows[name]):
                continue
            if timer is not None:
                rows[name]["ms"] = timer(call(region, fn))
        ok = [n for n, r in rows.items() if _correct(r)]
        preferred = [n for n in ok if n.startswith(choice)] if choice != "auto" else []
        pool = preferred or ok
        if not pool:
            raise RuntimeError(f"precision = 'fp8': no kernel computes the {region} region ({rows})")
        best = min(pool, key=lambda n: rows[n].get("ms", 0.0))
        picked[region] = named[best]
        info[region] = {"kernel": best, "candidates": rows}
        if choice != "auto" and not preferred:
            info[region]["note"] = f"no correct {choice!r} kernel: the fastest correct one serves"
    return picked, info


def pick_regions(
    cands: dict[str, dict[str, Any]],
    inputs: dict[str, torch.Tensor],
    eps: float,
    timer: Callable[[Callable[[], Any]], float] | None,
    choice: str = "auto",
) -> tuple[Regions, dict[str, Any]]:
    """Per region the fastest correct kernel (``timer(fn) -> ms``; :func:`region_error`).

    ``choice`` other than "auto" prefers the kernels whose name starts with it (the profile's
    variants); a region without such a kernel that passes takes the fastest that does. Without a
    timer (CPU) the first correct kernel serves. A kernel that raises or differs is recorded, never used.
    """
    # checked on 2k tokens (float64 copies of a 16k-token MLP activation would take GBs), timed on all
    check = {k: v if k == "w" else v[:2048] for k, v in inputs.items()}

    def call(region: str, fn: Any) -> Callable[[], Any]:
        if region == "norm":
            h, delta, w = inputs["h"].clone(), inputs["delta"], inputs["w"]
            return lambda: fn[1](h, delta, w, eps)
        return lambda: fn(inputs["gate_up"] if region == "silu_mul" else inputs["o"])

    picked, info = pick_each(cands, lambda r, fn: region_error(r, fn, check, eps), call, timer, choice)
    return (*picked["norm"], picked["silu_mul"], picked["quant"]), info


def region_inputs(
    tokens: int,
    hidden: int,
    inter: int,
    attn: int,
    w: torch.Tensor,
    device: torch.device,
    dtype: torch.dtype,
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """Random activations of a step's shapes; the residual and its update spread like a real stream's."""
    g = torch.Generator(device=device).manual_seed(seed)

    def rnd(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, device=device, generator=g) * scale).to(dtype)

    return {
        "h": rnd(tokens, hidden, scale=4.0),
        "delta": rnd(tokens, hidden),
        "w": w,
        "gate_up": rnd(tokens, 2 * inter, scale=2.0),
        "o": rnd(tokens, attn),
    }
