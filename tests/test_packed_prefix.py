"""The packed engine's shared prefix: each request's system + instruction + query computed once per
step, its documents' tails attending to it (bottom-right causal), on CPU with the exact per-sequence
SDPA (fp32) and the emulated FP8 GEMMs.

- the step's layout (positions continue after the prefix, each tail's keys are [P; T_i]);
- scores = whole prompts = the independent reference, several prefixes in one step, empty prefix;
- an attention kernel whose causal mask is top-left is caught and prefixes are then not shared;
- FP8: shared = unshared;
- the scheduler's budget counts computed tokens (the prefix once per request per step).
"""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from adapters.families.qwen3 import Qwen3PromptTokenizer, load_hf_tokenizer
from adapters.runtimes.packed import varlen
from adapters.runtimes.packed.forward import PackedQwen3Replica, load_backbone
from adapters.runtimes.packed.scheduler import PackedScheduler
from schemas.config import DEFAULT_INSTRUCTION
from tests import reference
from tests.test_packed_engine import DOCS, QUERIES


@pytest.fixture(scope="module")
def tok(tiny_qwen3_dir) -> Qwen3PromptTokenizer:
    return Qwen3PromptTokenizer(load_hf_tokenizer(str(tiny_qwen3_dir), None), max_length=512, max_query_tokens=64)


def _replica(tiny_qwen3_dir, tok, dtype=torch.float32) -> PackedQwen3Replica:
    backbone, head = load_backbone(str(tiny_qwen3_dir), None, dtype, (tok.no_id, tok.yes_id))
    return PackedQwen3Replica(backbone, head, torch.device("cpu"), attention="sdpa", compile=False)


@pytest.fixture(scope="module")
def replica(tiny_qwen3_dir, tok) -> PackedQwen3Replica:
    return _replica(tiny_qwen3_dir, tok)


def _groups(tok: Qwen3PromptTokenizer) -> list[tuple[list[int], list[list[int]]]]:
    """Three requests of different prefixes (queries, instructions) in one step, and one whole prompt."""
    tails = [[*d, *tok.suffix_ids] for d in tok.encode_documents(DOCS)]
    out = [
        (tok.encode_shared(q, instr), tails[i : i + 4])
        for i, (q, instr) in enumerate(
            zip(QUERIES, [DEFAULT_INSTRUCTION, "Find the answer.", DEFAULT_INSTRUCTION], strict=True)
        )
    ]
    out.append(([], [[*tok.encode_shared(QUERIES[0], "no prefix"), *tails[5]]]))  # a group without a prefix
    return out


def _flat(groups) -> list[list[int]]:
    return [[*pre, *t] for pre, tails in groups for t in tails]


def test_pack_layout(replica):
    """Positions continue after the prefix; each tail's keys are its prefix's rows then its own."""
    host, meta = replica._pack([([1, 2, 3], [[4, 5], [6]]), ([7], [[8]])])
    t = meta["tokens"]
    assert t == 8 and meta["sequences"] == 5 and meta["scored"] == 3 and (meta["max_q"], meta["max_k"]) == (3, 5)
    got = host.tolist()
    assert got[:t] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert got[t : 2 * t] == [0, 1, 2, 3, 4, 3, 0, 1]
    o = 2 * t
    assert got[o : o + 6] == [0, 3, 5, 6, 7, 8]  # cu_q: P, T1, T2, P', T1'
    assert got[o + 6 : o + 12] == [0, 3, 8, 12, 13, 15]  # cu_k: P, [P;T1], [P;T2], P', [P';T1']
    assert got[o + 12 : o + 15] == [4, 5, 7]  # the last token of each tail
    assert got[o + 15 :] == [0, 1, 2, 0, 1, 2, 3, 4, 0, 1, 2, 5, 6, 6, 7]  # key rows, sequence by sequence
    assert meta["lens_k"] == [3, 5, 4, 1, 2]
    # without prefixes: whole prompts, no cu_k and no gather index
    host, meta = replica._pack([([], [[1, 2], [3]])])
    assert host.tolist() == [1, 2, 3, 0, 1, 0, 0, 2, 3, 1, 2] and meta["kv"] == 0


def test_groups_equal_whole_prompts_and_reference(replica, tok, tiny_qwen3_dir):
    groups = _groups(tok)
    prompts = _flat(groups)
    shared = replica.score_groups(groups)
    want = reference.score_ids(str(tiny_qwen3_dir), prompts)
    assert max(abs(a - b) for a, b in zip(shared, want, strict=True)) < 1e-5
    assert max(abs(a - b) for a, b in zip(shared, replica.score(prompts), strict=True)) < 1e-5
    assert len({round(s, 5) for s in want}) > 5  # different documents and queries really score differently
    # a lone document, and one of a 1-token tail
    assert replica.score_groups([(groups[0][0], groups[0][1][:1])]) == pytest.approx(want[:1], abs=1e-5)
    one = [(groups[1][0], [tok.suffix_ids[-1:]])]
    assert replica.score_groups(one) == pytest.approx(reference.score_ids(str(tiny_qwen3_dir), _flat(one)), abs=1e-5)


def _top_left(q, k, v, cu_q, cu_k, max_q, max_k, lens_q, lens_k):
    """The classic mistake: SDPA's is_causal with fewer queries than keys (the prefix is hidden)."""
    out = []
    for qi, ki, vi in zip(q.split(lens_q), k.split(lens_k), v.split(lens_k), strict=True):
        o = torch.nn.functional.scaled_dot_product_attention(
            qi.transpose(0, 1)[None],
            ki.transpose(0, 1)[None],
            vi.transpose(0, 1)[None],
            is_causal=True,
            enable_gqa=True,
        )
        out.append(o[0].transpose(0, 1))
    return torch.cat(out)


def test_a_top_left_kernel_is_caught_and_prompts_run_whole(replica, tiny_qwen3_dir, tok, monkeypatch):
    assert varlen.bottom_right_error(varlen.sdpa_per_prompt, torch.device("cpu"), torch.float32) < 1e-5
    assert varlen.bottom_right_error(_top_left, torch.device("cpu"), torch.float32) > 0.3
    rep = replica
    monkeypatch.setattr(rep, "_attend", _top_left)
    monkeypatch.setattr(rep, "share_error", None)  # restored after the test, as _attend
    groups = _groups(tok)
    # what it would compute unchecked: wrong scores
    wrong = rep.score_groups(groups)
    want = reference.score_ids(str(tiny_qwen3_dir), _flat(groups))
    assert max(abs(a - b) for a, b in zip(wrong, want, strict=True)) > 1e-3
    rep.warm_up([_flat(groups)[:2]], [groups[:1]])
    assert not rep.can_share and "not bottom-right aligned" in rep.share_error
    assert rep.score_groups(groups) == pytest.approx(want, abs=1e-5)  # each prompt whole: exact again


def test_modules_mode_runs_groups_whole(tiny_qwen3_dir, tok):
    backbone, head = load_backbone(str(tiny_qwen3_dir), None, torch.float32, (tok.no_id, tok.yes_id))
    rep = PackedQwen3Replica(backbone, head, torch.device("cpu"), attention="sdpa", compile=False, mode="modules")
    groups = _groups(tok)
    assert not rep.can_share
    assert rep.score_groups(groups) == pytest.approx(reference.score_ids(str(tiny_qwen3_dir), _flat(groups)), abs=1e-5)


def test_fp8_shared_equals_unshared(tiny_qwen3_dir, tok):
    """The emulated FP8 forward: a prefix computed once gives each document the score its whole prompt gets."""
    rep = _replica(tiny_qwen3_dir, tok, torch.bfloat16)
    groups = _groups(tok)
    bf16 = rep.score(_flat(groups))
    rep.to_fp8()
    whole, shared = rep.score(_flat(groups)), rep.score_groups(groups)
    assert whole != bf16  # FP8 really ran
    diff = max(abs(a - b) for a, b in zip(shared, whole, strict=True))
    assert diff < 2e-3, diff  # bf16 activations: the prefix's GEMMs see other row counts, same values
    assert max(abs(a - b) for a, b in zip(shared, bf16, strict=True)) < 0.03


# -- the scheduler: budget in computed tokens ----------------------------------------------------


class _Recorder:
    """Records each step's groups; scores each prompt by a function of its tokens, so a score
    delivered to the wrong item shows. Its first step (a blocker request) waits until the test has
    queued everything, so the later steps' composition does not depend on thread timing."""

    device = "test"

    def __init__(self) -> None:
        self.steps: list[list[tuple[tuple[int, ...], int]]] = []
        self.queued = threading.Event()

    def score_groups(self, groups):
        self.queued.wait(5)
        self.steps.append([(tuple(pre), len(tails)) for pre, tails in groups])
        return [_value(pre, t) for pre, tails in groups for t in tails]

    def score(self, prompts, segments=None):
        self.queued.wait(5)
        self.steps.append([((), len(prompts))])
        return [_value([], p) for p in prompts]


def _value(pre, tail) -> float:
    """A function of the whole prompt prefix + tail (shared or not, the same item gets the same value)."""
    return sum((i + 1) * t for i, t in enumerate([*pre, *tail])) / 1e4


BLOCKER = ([3, 3], [[1]], [9])  # 4 tokens, alone in the first step
# (shared, items, suffix): A's prompts are 10 + 3 + 2 = 15 tokens, B's 8 + 4 + 2 = 14
A = ([1] * 10, [[10 + i] * 3 for i in range(5)], [9, 9])
B = ([2] * 8, [[20 + i] * 4 for i in range(3)], [9, 9])


async def _run(runner: _Recorder, budget: int, share: bool) -> tuple[list[list[tuple[tuple[int, ...], int]]], dict]:
    scheduler = PackedScheduler([runner], batch_tokens=budget, max_items=64, share_prefix=share)
    try:
        reqs = [scheduler.submit(*BLOCKER)]
        await asyncio.sleep(0.05)  # the worker has taken the blocker and waits in its step
        reqs += [scheduler.submit(*A), scheduler.submit(*B)]
        runner.queued.set()
        got = await asyncio.wait_for(asyncio.gather(*(r.future for r in reqs)), 5)
        assert got == [[_value(sh, [*it, *suf]) for it in items] for sh, items, suf in (BLOCKER, A, B)]
        return runner.steps[1:], scheduler.stats()
    finally:
        scheduler.stop()


PA, PB = tuple(A[0]), tuple(B[0])


@pytest.mark.anyio
async def test_budget_counts_the_prefix_once_per_request_per_step():
    # 48 computed tokens: A's five documents cost 10 + 5 x 5 = 35; B's first (8 + 6) would pass 48
    steps, stats = await _run(_Recorder(), 48, share=True)
    assert steps == [[(PA, 5)], [(PB, 3)]]
    assert stats["share_prefix"] is True
    assert stats["prompt_tokens"] == 4 + 5 * 15 + 3 * 14
    assert stats["computed_tokens"] == 4 + (10 + 5 * 5) + (8 + 3 * 6)
    # Without sharing the same budget holds three prompts (45 tokens) per step.
    steps, stats = await _run(_Recorder(), 48, share=False)
    assert steps == [[((), 3)], [((), 3)], [((), 2)]]
    assert stats["computed_tokens"] == stats["prompt_tokens"] == 4 + 5 * 15 + 3 * 14


@pytest.mark.anyio
async def test_several_prefixes_in_one_step_and_a_request_split_across_steps():
    steps, _ = await _run(_Recorder(), 100, share=True)
    assert steps == [[(PA, 5), (PB, 3)]]  # FIFO, each request's prefix once
    # 30 tokens: A's first step holds 10 + 4 x 5; its last document opens the next step, where A's
    # prefix counts again (10 + 5) and B's first document (8 + 6) fills it; B's other two follow.
    steps, stats = await _run(_Recorder(), 30, share=True)
    assert steps == [[(PA, 4)], [(PA, 1), (PB, 1)], [(PB, 2)]]
    assert stats["computed_tokens"] == 4 + (10 + 20) + (10 + 5 + 8 + 6) + (8 + 12)
    assert stats["steps_by_requests"] == {"1": 3, "2": 1}


def test_gather_kv_of_views_of_one_projection():
    """vLLM's q/k norm + RoPE leaves k and v as views of the fused projection: gathered in one copy."""
    from adapters.runtimes.packed.forward import _gather_kv

    qkv = torch.randn(7, (4 + 2 + 2) * 8)
    _, k, v = qkv.split((32, 16, 16), dim=-1)
    k, v = k.view(7, 2, 8), v.view(7, 2, 8)
    rows = torch.tensor([0, 1, 2, 0, 1, 5, 6, 6])
    gk, gv = _gather_kv(k, v, rows)
    assert torch.equal(gk, k[rows]) and torch.equal(gv, v[rows])
    assert gk.data_ptr() + 16 * 4 == gv.data_ptr()  # one buffer: the single-copy path ran
    sk, sv = _gather_kv(k.contiguous(), v.contiguous(), rows)  # separate tensors: two copies
    assert torch.equal(sk, gk) and torch.equal(sv, gv)
    # one-token tensors that merely sit next to each other in memory are not one buffer
    import numpy as np

    mem = np.arange(32, dtype=np.float32)
    k1, v1 = torch.from_numpy(mem[:16]).view(1, 2, 8), torch.from_numpy(mem[16:]).view(1, 2, 8)  # two storages
    assert v1.data_ptr() == k1.data_ptr() + 64
    assert torch.equal(_gather_kv(k1, v1, torch.tensor([0, 0]))[1], v1[[0, 0]])


class _Failing(_Recorder):
    """Fails every step that holds B's prefix; pipelined (launch / collect) when asked."""

    def __init__(self, pipelined: bool) -> None:
        super().__init__()
        self.pipelined = pipelined

    def score_groups(self, groups):
        if any(tuple(pre) == PB for pre, _ in groups):
            self.steps.append([(tuple(pre), len(tails)) for pre, tails in groups])
            raise RuntimeError("device fell over")
        return super().score_groups(groups)

    def launch_groups(self, groups, idle=False, eager=False):
        return groups

    def collect(self, groups):
        return self.score_groups(groups)


@pytest.mark.anyio
@pytest.mark.parametrize("pipelined", [False, True], ids=["whole-steps", "pipelined"])
async def test_a_failed_step_fails_its_requests_only_and_the_rest_is_not_computed(pipelined):
    runner = _Failing(pipelined)
    # 30 tokens: A alone in its first step, then [A's last, B's first] (fails), then nothing of B
    scheduler = PackedScheduler([runner], batch_tokens=30, max_items=64, share_prefix=True, error_type=ValueError)
    try:
        scheduler.submit(*BLOCKER)
        await asyncio.sleep(0.05)
        a, b = scheduler.submit(*A), scheduler.submit(*B)
        runner.queued.set()
        with pytest.raises(ValueError, match="forward pass failed on test: RuntimeError: device fell over"):
            await asyncio.wait_for(b.future, 5)
        with pytest.raises(ValueError):  # A's last document shared the failed step
            await asyncio.wait_for(a.future, 5)
        await asyncio.sleep(0.05)
        # B's other documents are never run -- except, pipelined, a step already launched when the
        # failed one is collected (the launcher may take it while the collector waits for the device)
        assert [n for s in runner.steps for pre, n in s if pre == PB] in (([1], [1, 2]) if pipelined else ([1],))
        c = scheduler.submit(*BLOCKER)  # and the scheduler keeps serving
        assert await asyncio.wait_for(c.future, 5) == [_value(BLOCKER[0], [*BLOCKER[1][0], *BLOCKER[2]])]
    finally:
        scheduler.stop()
