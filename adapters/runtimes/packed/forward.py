"""One model replica: a Qwen3 causal LM's loaded weights run packed, without padding.

The prompts of a step are concatenated into one token sequence (``T`` tokens); ``cu`` holds
the cumulative prompt lengths, positions restart at 0 for every prompt (RoPE sees each prompt
as if alone), and attention is causal *within* each prompt only:

- CUDA: varlen flash attention (vLLM's FlashAttention-3 when vLLM is installed, else flash-attn,
  else PyTorch's ``torch.nn.attention.varlen.varlen_attn``), no padding, no mask tensor;
- CPU (or ``attention = "sdpa"``): one causal ``scaled_dot_product_attention`` per prompt, the
  same kernel and arithmetic transformers' own SDPA path uses for a single unpadded sequence,
  hence exact.

Shared prefix (``score_groups``): a request's prompts all start with the same tokens (system +
instruction + query, ~38 % of a 100-document request's tokens). A step then holds each request's
prefix ``P`` once, followed by each document's tail ``T_i`` (document + suffix, positions
continuing from ``len(P)``): every GEMM runs on those tokens only. Attention is still one varlen
call: the prefix is a sequence of its own (q = k = P) and each tail has q = T_i, k = [P; T_i]
(the keys and values gathered by an index built on the host with the step), causal aligned
bottom-right. Causality makes it exact: the prefix's keys do not depend on what follows it.

Only the last position of each prompt (tail) goes through the last layer's MLP, the final norm and the
two LM-head rows ("no", "yes"). The checkpoint loads with transformers' real Qwen3 code; the
default "fused" mode concatenates each layer's q/k/v and gate/up weights (one GEMM each, the
modules keep views) and runs the same arithmetic as those modules, so it serves any
Qwen3ForCausalLM checkpoint without biases, GQA included.

The checkpoint's loading and its fused / FP8 weight layout are ``weights``; the host side of a
step (its layout in one buffer, staged for one copy) is ``step``; the kernels picked at start
(silu·mul, q/k norm + RoPE, FP8 regions, the prefix-sharing check) are chosen by ``picks``. This
module keeps the model's arithmetic: the forwards and their set-up on one device.

Imported only through ``adapters.registry`` (pulls in torch and transformers).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from adapters.runtimes.packed import fp8, fp8_gemm, kernels, picks, varlen
from adapters.runtimes.packed.step import Group, HostStaging, Step, pack, unpack
from adapters.runtimes.packed.step import gather_kv as _gather_kv  # the name tests/test_packed_prefix.py imports
from adapters.runtimes.packed.weights import FusedLayer, load_backbone

__all__ = ("Group", "PackedQwen3Replica", "load_backbone")


class PackedQwen3Replica:
    """The model on one device; ``score`` runs one packed step. Not thread-safe: one worker uses it.

    ``mode``: "fused" (default) runs q/k/v and gate/up as one GEMM each and, when compiling,
    compiles only the pointwise regions between the (eager cuBLAS) GEMMs -- each small graph
    compiles in seconds, where compiling the whole fused forward with dynamic shapes stalled for
    minutes on the H200 (docs/benchmarks/gpu-h200-2026-12-01); "modules" runs transformers'
    modules as they are and compiles the whole forward (the engine's first version, kept to compare).
    """

    def __init__(
        self,
        backbone: Any,
        head: torch.Tensor,
        device: torch.device,
        *,
        attention: str,
        compile: bool,
        mode: str = "fused",
        kernel: str = "auto",
        vllm_ops: bool = True,
    ) -> None:
        if mode not in ("fused", "modules"):
            raise ValueError(f"mode {mode!r}")
        self.device = device
        self.backbone = backbone.to(device)
        self.head = head.to(device)
        self.mode = mode
        self.attention_name, self._attend = varlen.pick_attention(attention, device, kernel)
        self._per_prompt = self._attend is varlen.sdpa_per_prompt
        self.compiled = compile
        # The scheduler overlaps the host side of step k+1 with step k on the device (CUDA only:
        # on CPU "launch" already computes, and overlapping would only delay delivery).
        self.pipelined = device.type == "cuda"
        self.compile_error: str | None = None
        self.silu_kernel = "torch" if mode == "fused" else "transformers module"
        self.silu_timing_ms: dict[str, float] = {}  # set at warm-up where there is a choice
        self.vllm_ops = vllm_ops
        self.qk_kernel = "torch" if mode == "fused" else "transformers module"
        self.qk_timing_ms: dict[str, float] = {}
        self._qk_vllm: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None
        self._cos_sin: torch.Tensor | None = None
        self._layers = [FusedLayer(layer) for layer in self.backbone.layers] if mode == "fused" else []
        self._eps = float(self.backbone.norm.variance_epsilon)
        self._staging = HostStaging(device)  # the host buffers each step is packed into
        self.share_error: str | None = None  # why prefixes are not shared (set by warm_up's kernel check)
        self._regions = (kernels.rms, kernels.add_rms, kernels.qkv_rope, kernels.silu_mul)
        self._run: Callable[..., torch.Tensor] = self._forward if mode == "modules" else self._forward_fused
        self.precision = "model dtype"
        self.mm_kernel: str | None = None
        self.mm_timing: dict[str, Any] = {}
        self._mm: fp8_gemm.Mm = fp8_gemm.mm_emulated
        self._fp8_regions: fp8.Regions = fp8.REFERENCE
        self.fp8_kernels: dict[str, Any] = {}  # per quantizing region: the kernel picked, each candidate's error / ms
        self._fp8_choice = "auto"
        # split = "pipeline" (adapters/runtimes/packed/pipeline.py): this replica holds a range of
        # the layers and hands the residual stream of each step to the stage holding the next ones.
        self.next_stage: PackedQwen3Replica | None = None
        self.layer_range = (0, len(self.backbone.layers))  # [first, end) of the model's layers held here
        # Steps the scheduler keeps launched and not collected: one more per further stage.
        self.in_flight = 1
        self._fp8_cands: tuple[bool, dict[str, dict[str, Any]]] | None = None
        if compile:
            self._compile()

    @property
    def label(self) -> str:
        """The devices this replica runs on, in stage order ("cuda:0>cuda:1" for a split)."""
        return ">".join(str(s.device) for s in self.chain())

    def chain(self) -> list[PackedQwen3Replica]:
        """This replica and the pipeline stages after it, in order (just itself without a split)."""
        out, stage = [], self
        while stage is not None:
            out.append(stage)
            stage = stage.next_stage
        return out

    def to_fp8(
        self, quantize: Callable[[torch.Tensor], fp8_gemm.Fp8Weight] | None = None, regions: str = "auto"
    ) -> None:
        """Quantize the four GEMMs of every layer to e4m3 (per-channel scales) and run them in FP8 from now on.

        Attention, norms, RoPE, the residual stream and the head stay in the model dtype. The GEMM
        kernel and each quantizing region's kernel are picked now (timed on a d100 step's shapes;
        ``regions`` = "triton", "vLLM", "compiled" prefers one family, for the profile). ``warm_up`` again afterwards.
        """
        if self.mode != "fused":
            raise ValueError("precision = 'fp8' needs the fused mode")
        if self.next_stage is not None:
            self.next_stage.to_fp8(quantize, regions)
        for w, layer in zip(self._layers, self.backbone.layers, strict=True):
            w.quantize(layer, quantize or fp8_gemm.quantize_weight)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        k, n = self._layers[0].f8[2].qt.shape
        with torch.inference_mode():
            self.mm_kernel, self._mm, self.mm_timing = fp8_gemm.pick_mm(
                self.device, (16384, k, n), self.backbone.norm.weight.dtype
            )
        self.precision = "fp8 e4m3 GEMMs (per-channel weight, per-token activation scales)"
        self._run = self._forward_fp8
        self.pick_fp8_regions(regions)

    @torch.inference_mode()
    def pick_fp8_regions(self, choice: str = "auto") -> None:
        """Each quantizing region's kernel: the fastest on a 16k-token step's shapes that computes fp8.REFERENCE's result."""
        self._fp8_choice = choice
        if self._fp8_cands is None or self._fp8_cands[0] != self.compiled:  # compiled once, not per pick
            self._fp8_cands = (self.compiled, fp8.candidates(self.compiled, self.device.type == "cuda"))
        self._fp8_regions, self.fp8_kernels = picks.pick_fp8_regions(
            self._fp8_cands[1], self._layers[0], self._eps, self.device, self.backbone.norm.weight.dtype, choice
        )
        self.silu_kernel = f"silu·mul + fp8 quantization: {self.fp8_kernels['silu_mul']['kernel']}"

    def _compile(self) -> None:
        import torch._dynamo

        # One graph per region (or per replica) and per specialization (one prompt vs several).
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        if self.mode == "modules":
            self._run = torch.compile(self._forward, dynamic=True)
        else:
            self._regions = tuple(
                torch.compile(f, dynamic=True)
                for f in (kernels.rms, kernels.add_rms, kernels.qkv_rope, kernels.silu_mul)
            )

    def _uncompile(self) -> None:
        self.compiled = False
        self._regions = (kernels.rms, kernels.add_rms, kernels.qkv_rope, kernels.silu_mul)
        if self._run == self._forward_fp8:  # the Triton / vLLM kernels picked stay; compiled ones go
            self.pick_fp8_regions(self._fp8_choice)
        else:
            self._run = self._forward if self.mode == "modules" else self._forward_fused

    @classmethod
    def replicas(
        cls, backbone: Any, head: torch.Tensor, devices: Sequence[torch.device], **kw: Any
    ) -> list[PackedQwen3Replica]:
        """One replica per device; every replica but the last gets its own copy of the weights."""
        out = []
        for i, dev in enumerate(devices):
            out.append(cls(backbone if i == len(devices) - 1 else copy.deepcopy(backbone), head, dev, **kw))
        return out

    def warm_up(self, batches: Sequence[Sequence[Sequence[int]]], shared: Sequence[Sequence[Group]] = ()) -> None:
        """Run ``batches`` (prompts) and ``shared`` (steps of prefix + tails groups) now so compilation
        happens before traffic; an uncompilable graph falls back to eager. Before the shared steps the
        attention kernel's bottom-right alignment is checked; where it fails prefixes are not shared."""
        if shared and self.can_share:
            self._check_sharing()

        def run() -> None:
            for batch in batches:
                self.score(batch)
            for step in shared:
                self.score_groups(step)

        try:
            run()
        except Exception as exc:
            if not self.compiled:
                raise
            self.compile_error = f"{type(exc).__name__}: {exc}"[:500]
            for stage in self.chain():
                stage._uncompile()
            run()
        if batches:
            before = self.score(batches[-1])
            for stage in self.chain():
                stage._pick_silu()
            try:  # end to end with the kernels picked (q/k/v are then strided views for attention)
                after = self.score(batches[-1])
                ok = max(abs(a - b) for a, b in zip(after, before, strict=True)) < 0.05
                if shared:
                    self.score_groups(shared[-1])  # ... and gathered for the tails' keys
            except Exception as exc:  # noqa: BLE001
                self.qk_timing_ms = {"error": f"{type(exc).__name__}: {exc}"[:200]}  # type: ignore[dict-item]
                ok = False
            if not ok:
                for stage in self.chain():
                    stage._qk_vllm, stage.qk_kernel = None, "torch"

    def _check_sharing(self) -> None:
        """Tails attend to [P; T_i]: prefixes are shared only with a kernel that aligns causal masks bottom-right."""
        err = picks.sharing_error(
            self._attend, self.attention_name, self.device, self.backbone.embed_tokens.weight.dtype
        )
        if err is not None:
            self.share_error = err

    @torch.inference_mode()
    def _pick_silu(self) -> None:
        """vLLM's CUDA kernels or the compiled regions, whichever is faster here, timed now (~20 ms).

        silu(gate) * up, and q/k norm + RoPE likewise (``picks``). A kernel that does not compute
        the same function (checked on random data first) is never used.
        """
        if not self.vllm_ops or self.mode != "fused" or self.device.type != "cuda":
            return
        silu_op, qk_op = kernels.vllm_silu_mul(), kernels.vllm_qk_norm_rope()
        if self._run == self._forward_fp8:
            silu_op = None  # fp8: silu·mul is fused with the quantization of its output
        w = self._layers[0]
        dim = self.backbone.layers[0].self_attn.head_dim
        with torch.cuda.device(self.device):
            x = torch.randn(16384, w.gate_up.shape[0], dtype=w.gate_up.dtype, device=self.device)
            if silu_op is not None:
                op, timing = picks.pick_silu_mul(silu_op, self._regions[3], x)
                if timing is not None:
                    self.silu_timing_ms = timing
                if op is not None:
                    self._regions = (*self._regions[:3], op)
                    self.silu_kernel = "vLLM silu_and_mul"
            if qk_op is not None:
                op, self.qk_timing_ms = picks.pick_qk_norm_rope(
                    qk_op,
                    self._regions[2],
                    w,
                    self._eps,
                    dim,
                    self.backbone.rotary_emb,
                    self._cos_sin_cache,
                    self.device,
                )
                if op is not None:
                    self._qk_vllm = op
                    self.qk_kernel = "vLLM fused_qk_norm_rope"

    def _cos_sin_cache(self, n: int) -> torch.Tensor:
        """vLLM's RoPE table layout: (positions, [cos | sin] of the rotary half), from the model's own rotary_emb."""
        if self._cos_sin is None or self._cos_sin.shape[0] < n:
            size = max(4096, 1 << (n - 1).bit_length())
            w = self._layers[0].qkv
            cos, sin = self.backbone.rotary_emb(
                torch.empty(1, dtype=w.dtype, device=w.device), torch.arange(size, device=w.device)[None]
            )
            half = cos.shape[-1] // 2
            self._cos_sin = torch.cat((cos[0, :, :half], sin[0, :, :half]), dim=-1).to(w.dtype).contiguous()
        return self._cos_sin

    def score(self, prompts: Sequence[Sequence[int]], segments: Sequence[int | None] | None = None) -> list[float]:
        """P(yes) over {no, yes} at the last position of each prompt (decoder prompts have no token types)."""
        return self.collect(self.launch(prompts, segments))

    def score_groups(self, groups: Sequence[Group]) -> list[float]:
        """P(yes) of each prompt prefix + tail, every group's prefix computed once (flattened in order)."""
        return self.collect(self.launch_groups(groups))

    @property
    def can_share(self) -> bool:
        """Whether ``launch_groups`` computes prefixes once: the fused forwards do, with a kernel that
        aligns causal masks bottom-right (checked at warm-up); otherwise each prompt runs whole."""
        return self.mode == "fused" and self.share_error is None

    def _pack(self, groups: Sequence[Group]) -> tuple[torch.Tensor, dict[str, Any]]:
        """The step in one int64 host tensor (``step.pack``) and its layout."""
        return pack(groups, self._staging)

    def launch(
        self,
        prompts: Sequence[Sequence[int]],
        segments: Sequence[int | None] | None = None,
        *,
        idle: bool = False,
        eager: bool = False,
    ) -> tuple[torch.Tensor, int]:
        """Prepare the step on the host and queue its kernels; on CUDA this returns before they ran.

        ``segments`` (the scheduler's token-type starts) is None throughout for Qwen3 prompts;
        ``idle`` and ``eager`` are for CUDA graphs, which Qwen3 steps do not use."""
        return self.launch_groups([((), [p]) for p in prompts])

    @torch.inference_mode()
    def launch_groups(
        self, groups: Sequence[Group], *, idle: bool = False, eager: bool = False
    ) -> tuple[torch.Tensor, int]:
        """``launch`` for prefix + tails groups; without prefix sharing each prompt is packed whole."""
        if not self.can_share and any(len(pre) for pre, _ in groups):
            groups = [((), [[*pre, *tail] for tail in tails]) for pre, tails in groups]
        n = sum(len(tails) for _, tails in groups)
        if self.compiled and n == 1:
            # dynamic=True still specializes a size of 1: a 1-token second prompt keeps one graph.
            tail = next(tails[0] for _, tails in groups if tails)
            groups = [*groups, ((), [tail[-1:]])]
        host, meta = self._pack(groups)
        dev = self.device
        if dev.type != "cuda":
            return self._run_packed(host, meta), n
        with torch.cuda.device(dev):  # this worker thread launches on its own GPU
            return self._run_packed(self._staging.to_device(host), meta), n

    def _run_packed(self, d: torch.Tensor, meta: dict[str, Any]) -> torch.Tensor:
        """Split ``_pack``'s buffer (on the device) into the forward's inputs and run it."""
        return self._run(*unpack(d, meta, self._per_prompt))

    def collect(self, handle: tuple[torch.Tensor, int]) -> list[float]:
        probs, n = handle
        return probs[:n].tolist()  # waits for the device

    def _attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, step: Step) -> torch.Tensor:
        """Varlen attention of the step; with shared prefixes each tail's keys are [P; T_i], gathered here."""
        if step.kv is not None:
            k, v = _gather_kv(k, v, step.kv)
        return self._attend(q, k, v, step.cu_q, step.cu_k, step.max_q, step.max_k, step.lens_q, step.lens_k)

    def resume(self, h: torch.Tensor, positions: torch.Tensor, step: Step) -> torch.Tensor:
        """Run this stage's layers on the previous stage's residual stream ``h`` (a pipeline split)."""
        dev = self.device

        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            # Into a GPU: queued behind the previous stage's kernels. Into the CPU: blocking, or the
            # CPU would read the stream before the copy has landed.
            return None if t is None else t.to(dev, non_blocking=dev.type == "cuda")

        h, positions = move(h), move(positions)
        step = step._replace(cu_q=move(step.cu_q), cu_k=move(step.cu_k), kv=move(step.kv), last=move(step.last))
        if self._per_prompt and step.lens_q is None:  # a CPU stage after a GPU one: SDPA needs the lengths
            step = step._replace(lens_q=step.cu_q.diff().tolist(), lens_k=step.cu_k.diff().tolist())
        run = self._forward_fp8 if self._run == self._forward_fp8 else self._forward_fused
        if dev.type != "cuda":
            return run(None, positions, step, h)
        with torch.cuda.device(dev):  # kernels that launch on the current device (Triton, FA3) land here
            return run(None, positions, step, h)

    def _forward_fused(
        self, ids: torch.Tensor | None, positions: torch.Tensor, step: Step, h: torch.Tensor | None = None
    ) -> torch.Tensor:
        rms, add_rms, qkv_rope, silu_mul = self._regions
        bb, eps = self.backbone, self._eps
        h = bb.embed_tokens(ids) if h is None else h
        n_tokens = h.shape[0]
        qk_vllm = self._qk_vllm
        if qk_vllm is None:
            cos, sin = bb.rotary_emb(h, positions[None])  # (1, T, D), whatever RoPE scaling the config has
            cos, sin = cos[0, :, None, :], sin[0, :, None, :]
        else:
            cos_sin = self._cos_sin_cache(step.max_k)
        last = step.last
        layers = self._layers
        x = rms(h, layers[0].ln1, eps)
        dim = bb.layers[0].self_attn.head_dim
        for i, w in enumerate(layers):
            if qk_vllm is None:
                q, k, v = qkv_rope(F.linear(x, w.qkv), w.q_norm, w.k_norm, eps, cos, sin, w.heads, w.kv_heads, dim)
            else:
                q, k, v = qk_vllm(
                    F.linear(x, w.qkv), w.q_norm, w.k_norm, eps, positions, cos_sin, w.heads, w.kv_heads, dim
                )
            o = self._attention(q, k, v, step)
            delta = F.linear(o.view(n_tokens, -1), w.o)
            if i == len(layers) - 1 and self.next_stage is None:
                # nothing after this attention mixes positions: keep the scored ones
                h, delta = h[last], delta[last]
            h, x = add_rms(h, delta, w.ln2, eps)
            m = F.linear(silu_mul(F.linear(x, w.gate_up)), w.down)
            if i + 1 == len(layers) and self.next_stage is not None:  # the next stage's layers
                return self.next_stage.resume(h + m, positions, step)
            nxt = layers[i + 1].ln1 if i + 1 < len(layers) else bb.norm.weight
            h, x = add_rms(h, m, nxt, eps)
        logits = x.float() @ self.head.T  # (prompts, 2): [no, yes]
        return torch.softmax(logits, dim=-1)[:, 1]

    def _forward_fp8(
        self, ids: torch.Tensor | None, positions: torch.Tensor, step: Step, h: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``_forward_fused`` with the four GEMMs of each layer in FP8; their inputs are quantized
        by the region that produces them (the attention output by a small one of its own)."""
        rms_q, add_rms_q, silu_mul_q, quant = self._fp8_regions
        qkv_rope, add_rms = self._regions[2], self._regions[1]
        bb, eps, mm = self.backbone, self._eps, self._mm
        h = bb.embed_tokens(ids) if h is None else h
        n_tokens = h.shape[0]
        dt = h.dtype
        qk_vllm = self._qk_vllm
        if qk_vllm is None:
            cos, sin = bb.rotary_emb(h, positions[None])
            cos, sin = cos[0, :, None, :], sin[0, :, None, :]
        else:
            cos_sin = self._cos_sin_cache(step.max_k)
        last = step.last
        layers = self._layers
        x, xs = rms_q(h, layers[0].ln1, eps)
        dim = bb.layers[0].self_attn.head_dim
        for i, w in enumerate(layers):
            f_qkv, f_o, f_gate_up, f_down = w.f8
            if qk_vllm is None:
                q, k, v = qkv_rope(mm(x, xs, f_qkv, dt), w.q_norm, w.k_norm, eps, cos, sin, w.heads, w.kv_heads, dim)
            else:
                q, k, v = qk_vllm(
                    mm(x, xs, f_qkv, dt), w.q_norm, w.k_norm, eps, positions, cos_sin, w.heads, w.kv_heads, dim
                )
            o = self._attention(q, k, v, step).reshape(n_tokens, -1)
            if i == len(layers) - 1 and self.next_stage is None:
                h, o = h[last], o[last]  # nothing after this attention mixes positions
            delta = mm(*quant(o), f_o, dt)
            h, x, xs = add_rms_q(h, delta, w.ln2, eps)
            m = mm(*silu_mul_q(mm(x, xs, f_gate_up, dt)), f_down, dt)
            if i + 1 == len(layers) and self.next_stage is not None:  # the next stage's layers
                return self.next_stage.resume(h + m, positions, step)
            if i + 1 < len(layers):
                h, x, xs = add_rms_q(h, m, layers[i + 1].ln1, eps)
            else:  # the final norm feeds the two head rows in fp32, not a GEMM: no quantization
                h, x = add_rms(h, m, bb.norm.weight, eps)
        logits = x.float() @ self.head.T
        return torch.softmax(logits, dim=-1)[:, 1]

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, step: Step) -> torch.Tensor:
        bb = self.backbone
        n_tokens = ids.shape[0]
        h = bb.embed_tokens(ids)
        cos, sin = bb.rotary_emb(h, positions[None])  # (1, T, D), whatever RoPE scaling the config has
        cos, sin = cos[0, :, None, :], sin[0, :, None, :]
        last = step.last
        n_layers = len(bb.layers)
        for i, layer in enumerate(bb.layers):
            a = layer.self_attn
            x = layer.input_layernorm(h)
            q = a.q_norm(a.q_proj(x).view(n_tokens, -1, a.head_dim))
            k = a.k_norm(a.k_proj(x).view(n_tokens, -1, a.head_dim))
            v = a.v_proj(x).view(n_tokens, -1, a.head_dim)
            q = q * cos + kernels.rotate_half(q) * sin
            k = k * cos + kernels.rotate_half(k) * sin
            o = self._attention(q, k, v, step)
            h = h + a.o_proj(o.reshape(n_tokens, -1))
            if i == n_layers - 1:
                h = h[last]  # nothing after this attention mixes positions: keep the scored ones
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        logits = bb.norm(h).float() @ self.head.T  # (prompts, 2): [no, yes]
        return torch.softmax(logits, dim=-1)[:, 1]
