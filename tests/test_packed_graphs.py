"""The padded layout CUDA graphs replay (``adapters/runtimes/packed/graphs.py``), checked on CPU.

A graph has fixed shapes, so a step is padded to a bucket: padding tokens after the last pair,
empty pairs after the real ones. These tests run the packed cross-encoder replicas (XLM-R, BERT
with token types, ELECTRA, ModernBERT with cls and mean pooling) through that layout with a
varlen reference kernel that, like FlashAttention's varlen kernels, reads only the cumulative
lengths and leaves every row outside a pair untouched -- here filled with NaN, so a padding row
that leaked into a real pair's score would show. The logits of the real pairs must equal the
unpadded step's. The capture and replay themselves need CUDA: the engine checks a replay
against the eager forward at start (``PackedPairReplica.use_graphs``) and the GPU report gives it.
"""

from __future__ import annotations

import contextlib
import itertools
from pathlib import Path

import pytest

from tests.corpus import DOCS, Q
from tests.tiny_encoders import build_tiny_cross_encoder, build_tiny_modernbert

KINDS = ("xlmr", "bert", "electra", "modernbert", "modernbert-mean")
LONG = ["Washington, D.C. is the capital of the United States. It is a federal district. " * 2]


def test_buckets_pad_little_and_always_leave_a_padding_token_and_an_empty_pair():
    from adapters.runtimes.packed.buckets import bucket_key, pow2_bucket, token_bucket

    # 16 short of a multiple of the step: never a multiple of 64 (a slower cuBLAS pick, graphs.py)
    assert [token_bucket(t) for t in (1, 240, 241, 4080, 4081, 16368, 16369, 65520)] == [
        240,
        240,
        496,
        4080,
        4336,
        16368,
        16880,
        65520,
    ]
    assert all(token_bucket(t) % 64 == 48 for t in range(1, 70_000, 7))
    assert [pow2_bucket(x, 16) for x in (1, 16, 17, 101)] == [16, 16, 32, 128]
    for tokens in range(1, 70_000, 97):
        t, _, _ = bucket_key(tokens, 1, 1)
        assert t > tokens
        if tokens > 4096:
            assert (t - tokens) / tokens <= 1 / 16
    assert bucket_key(14_900, 100, 200) == (15_344, 128, 256)
    assert len({token_bucket(t) for t in range(32_769, 65_521)}) == 16
    assert bucket_key(100, 15, 50)[1:] == (16, 64)  # 15 pairs + one empty one


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("packed-graphs")
    out = {kind: build_tiny_cross_encoder(base / kind, kind=kind) for kind in ("xlmr", "bert", "electra")}
    out["modernbert"] = build_tiny_modernbert(base / "modernbert")
    out["modernbert-mean"] = build_tiny_modernbert(
        base / "modernbert-mean", pooling="mean", id2label={0: "irrelevant", 1: "relevant"}, seed=1
    )
    return out


# The key tile of the reference below: FlashAttention-3 loads keys and values in tiles of 128 or
# more rows; the tiny test pairs are 10-40 tokens, so a tile of 16 reaches past most of them.
TILE = 16


def _varlen_reference(window: int | None):
    """FlashAttention varlen's behaviour on CPU: sequences from ``cu_q`` only (host lengths ignored),
    empty ones allowed, rows after the last sequence untouched (NaN here), and FA3's tiles: each
    sequence's keys and values are read in whole ``TILE``-row tiles past its end (the next pair's
    rows, or the padding), their scores masked to -inf and their values multiplied by the zero
    weights -- so a NaN in a padding row's value reaches the pair before it (FA3 issue #1745)."""
    import torch

    def attend(q, k, v, cu_q, cu_k, max_q, max_k, lens_q, lens_k):
        cu = cu_q.tolist()
        out = torch.full_like(q, float("nan"))
        for a, b in itertools.pairwise(cu):
            assert b - a <= max_q  # the bucket's max length covers every pair
            if b == a:
                continue
            end = min(a + -(-(b - a) // TILE) * TILE, q.shape[0])
            s = torch.einsum("qhd,khd->hqk", q[a:b], k[a:end]) / q.shape[-1] ** 0.5
            i, j = torch.arange(b - a)[:, None], torch.arange(end - a)[None, :]
            hidden = (j >= b - a) | ((i - j).abs() > window if window is not None else False)
            p = s.masked_fill(hidden, float("-inf")).softmax(-1)  # exactly 0 on the hidden keys
            out[a:b] = torch.einsum("hqk,khd->qhd", p, v[a:end])
        return out

    return attend


@pytest.fixture(scope="module")
def replicas(dirs):
    """(replica, tokenizer) per kind, fp32 on CPU, attending through the varlen reference."""
    import torch
    from transformers import AutoTokenizer

    from adapters.runtimes.packed import varlen
    from adapters.runtimes.packed.encoder_replicas import make_replica
    from adapters.runtimes.packed.pair_replica import load_cross_encoder

    real = varlen.pick_attention

    def pick(choice, device, kernel="auto", *, causal=True, dtype=None, window=None):
        if choice == "sdpa":
            return real(choice, device, kernel, causal=causal, dtype=dtype, window=window)
        return "varlen reference", _varlen_reference(window)

    varlen.pick_attention = pick
    try:
        out = {
            kind: (
                make_replica(
                    load_cross_encoder(str(d), None, torch.float32),
                    torch.device("cpu"),
                    attention="auto",
                    compile=False,
                ),
                AutoTokenizer.from_pretrained(d),
            )
            for kind, d in dirs.items()
        }
    finally:
        varlen.pick_attention = real
    for replica, _ in out.values():
        assert replica.attention_name.startswith("varlen reference") and not replica._per_sequence
    return out


def _step(tok, kind: str):
    """Pairs of two queries (BERT: two token-type starts) and their segment starts."""
    prompts, segments = [], []
    for q in (Q, "capital punishment"):
        for d in [*DOCS, *LONG]:
            enc = tok(q, d)
            prompts.append(enc["input_ids"])
            types = enc.get("token_type_ids")
            segments.append(types.index(1) if kind == "bert" and 1 in types else None)
    return prompts, segments


@pytest.mark.parametrize("kind", KINDS)
def test_real_pairs_score_the_same_in_a_padded_bucket(replicas, kind):
    from adapters.runtimes.packed.buckets import bucket_key
    from adapters.runtimes.packed.graphs import run_padded

    replica, tok = replicas[kind]
    prompts, segments = _step(tok, kind)
    want = replica.score(prompts, segments)
    lens = [len(p) for p in prompts]
    n = len(prompts)
    # the step's own bucket, and a much larger one (more padding tokens, pairs and max length)
    for key in (bucket_key(sum(lens), n, max(lens)), (sum(lens) + 700, 4 * n, 4 * max(lens))):
        host, _ = replica._pack(prompts, segments, pad=key[:2])
        out = run_padded(replica._forward, host, key)
        assert out.shape[0] == key[1]
        got = out[:n].tolist()
        for g, w in zip(got, want, strict=True):
            assert g == pytest.approx(w, abs=1e-5)


def test_a_bucket_whose_capture_fails_runs_eagerly_and_is_not_captured_again(replicas, monkeypatch):
    """Out of memory or an op capture refuses, at a bucket's first step: that step and every later
    one of the bucket run eagerly (same scores), the engine keeps serving, the stats say why."""
    import torch

    from adapters.runtimes.packed import graphs

    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)  # CPU: no pool, no device context
    monkeypatch.setattr(torch.cuda, "device", lambda _d: contextlib.nullcontext())
    replica, tok = replicas["xlmr"]
    prompts, segments = _step(tok, "xlmr")
    want = replica.score(prompts, segments)
    step_graphs = graphs.StepGraphs(replica._forward, torch.device("cpu"), offset=replica._offset, max_tokens=65536)
    tried = []

    def capture(key):
        tried.append(key)
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(step_graphs, "_capture", capture)
    monkeypatch.setattr(replica, "graphs", step_graphs)
    assert replica.score(prompts, segments) == want
    assert replica.score(prompts, segments) == want
    assert len(tried) == 1
    stats = step_graphs.stats()
    assert stats["eager_steps"] == 2 and stats["replays"] == 0 and stats["graphs"] == 0
    assert list(stats["failed_captures"].values()) == ["RuntimeError: operation not permitted when stream is capturing"]


def _cpu_graphs(monkeypatch, forward=lambda *a: None, offset=0):
    """A ``StepGraphs`` on CPU: no pool, no device context (captures and replays are stubbed by the tests)."""
    import torch

    from adapters.runtimes.packed import graphs

    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    monkeypatch.setattr(torch.cuda, "device", lambda _d: contextlib.nullcontext())
    return graphs.StepGraphs(forward, torch.device("cpu"), offset=offset, max_tokens=65536)


class _Stream:
    """A CPU stand-in for ``torch.cuda.Stream``: named, waits and synchronizes as no-ops."""

    def __init__(self, name: str = "capture") -> None:
        self.name = name

    def wait_stream(self, _other) -> None:
        pass

    def synchronize(self) -> None:
        pass


def _fake_capture_api(monkeypatch, graph, stream=lambda _s: contextlib.nullcontext()) -> None:
    """``torch.cuda``'s streams, graph class (``graph``: a factory) and cache flush, faked for ``StepGraphs._capture``."""
    import torch

    monkeypatch.setattr(torch.cuda, "Stream", lambda _device: _Stream())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda _device: _Stream("main"))
    monkeypatch.setattr(torch.cuda, "stream", stream)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", graph)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)


def test_a_class_first_step_warms_on_the_replay_stream_and_the_capture_stream_only_captures(monkeypatch):
    """Graphs keep their capture stream's cuBLAS workspace (PyTorch keeps one per stream), so an
    eager step there could write it while an earlier graph replays on the main stream (non-finite
    logits on the H200, report gpu-h200-2026-12-03): the first capture of a (pairs, max length)
    class runs its warm step on the main stream, and the capture stream runs nothing but captures."""
    import torch

    state = {"stream": "main", "capturing": False}
    runs = []

    class Graph:
        def capture_begin(self, **_kw):
            state["capturing"] = True

        def capture_end(self):
            state["capturing"] = False

    @contextlib.contextmanager
    def on(stream):
        was, state["stream"] = state["stream"], stream.name
        try:
            yield
        finally:
            state["stream"] = was

    def forward(ids, *_rest):
        runs.append((state["stream"], state["capturing"]))
        return torch.zeros(4, 1)

    _fake_capture_api(monkeypatch, Graph, on)
    g = _cpu_graphs(monkeypatch, forward)
    g._capture((4080, 32, 256))
    g._capture((4336, 32, 256))  # same class: no warm step
    g._capture((4080, 64, 256))  # a new class
    assert runs == [("main", False), ("capture", True), ("capture", True), ("main", False), ("capture", True)]
    assert g.captures == 3


def test_a_later_bucket_whose_capture_fails_is_warmed_and_captured_once_more(monkeypatch):
    """A later bucket of a class is captured without a run of its own; if that capture fails (say a
    compiled region compiling for the new token count inside it), the bucket runs once outside
    the capture and is captured again. A class's first capture (warmed already) and a second
    failure are not retried: the bucket is the caller's to record as failed (eager from then on)."""
    import torch

    state = {"capturing": False}
    runs = []
    refuse = {4336: 1, 4592: 2}  # how many captures of that token count to refuse

    class Graph:
        def capture_begin(self, **_kw):
            state["capturing"] = True

        def capture_end(self):
            state["capturing"] = False

    def forward(ids, *_rest):
        t = ids.shape[0]
        runs.append((t, state["capturing"]))
        if state["capturing"] and refuse.get(t, 0) > 0:
            refuse[t] -= 1
            raise RuntimeError(f"operation not permitted when stream is capturing ({t})")
        return torch.zeros(4, 1)

    _fake_capture_api(monkeypatch, Graph)
    g = _cpu_graphs(monkeypatch, forward)
    g._capture((4080, 32, 256))  # the class's first: warmed, captured
    g._capture((4336, 32, 256))  # refused once: warmed, captured again
    assert runs == [(4080, False), (4080, True), (4336, True), (4336, False), (4336, True)]
    assert g.captures == 2
    assert g.stats()["captured_after_a_warm_run"] == {
        "4336x32x256": "RuntimeError: operation not permitted when stream is capturing (4336)"
    }
    runs.clear()
    with pytest.raises(RuntimeError, match=r"\(4592\)"):  # refused twice: the second failure is raised
        g._capture((4592, 32, 256))
    assert runs == [(4592, True), (4592, False), (4592, True)] and g.captures == 2
    runs.clear()
    refuse[4080] = 1
    with pytest.raises(RuntimeError, match=r"\(4080\)"):  # a class's first capture: warmed already, no retry
        g._capture((4080, 64, 256))
    assert runs == [(4080, False), (4080, True)]


def test_a_capture_that_fails_leaves_the_pool_routing_ended_and_reports_its_own_error(monkeypatch):
    """torch 2.11's ``capture_end`` raises on a broken capture before it ends the allocator's
    routing into the graphs' pool; left on, every later capture of the replica failed "already
    recording to mempool_id" (H100, 2026-12-05). The fake below keeps that order: after one
    failed capture the next class must still capture, and the failure recorded is the run's."""
    import torch

    from adapters.runtimes.packed import graphs

    routing = {"on": False}
    ended = []

    class Graph:
        def capture_begin(self, **_kw):
            if routing["on"]:
                raise RuntimeError("beginAllocateToPool: already recording to mempool_id")
            routing["on"] = True
            self.broken = False

        def capture_end(self):  # torch 2.11's order: the capture's error first, the routing after
            if self.broken:
                raise RuntimeError("operation failed due to a previous error during capture")
            routing["on"] = False

    def end_allocate(device, pool):
        ended.append(device)
        if not routing["on"]:
            raise RuntimeError("endAllocatePool: not currently recording to mempool_id")
        routing["on"] = False

    def forward(ids, *_rest):
        if ids.shape[0] == 4080 and routing["on"]:  # the first class's capture: an op capture refuses
            graph_made[-1].broken = True
            raise RuntimeError("operation not permitted when stream is capturing")
        return torch.zeros(4, 1)

    graph_made: list[Graph] = []

    def new_graph():
        graph_made.append(Graph())
        return graph_made[-1]

    _fake_capture_api(monkeypatch, new_graph)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch._C, "_cuda_endAllocateToPool", end_allocate, raising=False)
    g = _cpu_graphs(monkeypatch, forward)
    with pytest.raises(graphs.CaptureError, match="operation not permitted when stream is capturing"):
        g._launch(torch.zeros(4080, dtype=torch.long), (4080, 32, 256), 4000, lambda dst, src: None)
    assert ended == [0] and not routing["on"]
    g._capture((4336, 64, 256))  # another class: captures
    assert g.captures == 1 and not routing["on"]
    # a torch that ends the routing itself: ending it again raises, which is ignored
    broken = Graph()
    broken.capture_begin()
    broken.broken = True
    routing["on"] = False
    g._end_capture(broken, failed=True)
    assert ended == [0, 0]
    with pytest.raises(RuntimeError, match="previous error during capture"):
        g._end_capture(broken, failed=False)  # capture_end's own error, when the run did not raise


def test_an_idle_step_replays_the_smallest_captured_bucket_that_holds_it(monkeypatch):
    """``idle`` (nothing waits behind the step): a bucket not captured yet borrows the smallest
    captured one with room for it (a padding token and an empty pair to spare, as long a max
    length) and at most ``COVER`` x its tokens; under load the step captures its own."""
    from adapters.runtimes.packed.buckets import bucket_key
    from adapters.runtimes.packed.graphs import COVER

    g = _cpu_graphs(monkeypatch)
    own = bucket_key(4000, 30, 200)  # (4080, 32, 256)
    assert g.key(4000, 30, 200, idle=True) == own  # nothing captured: capture its own
    fits, larger, too_big = (4336, 32, 256), (4592, 64, 512), (int(COVER * own[0]) + 256, 32, 256)
    short_pairs, short_len = (4200, 16, 256), (4200, 32, 128)
    for k in (larger, too_big, short_pairs, short_len, fits):
        g._graphs[k] = object()  # as a capture leaves it
    assert g.key(4000, 30, 200, idle=True) == fits
    assert g.key(4000, 30, 200) == own  # under load
    assert g.key(4336, 30, 200, idle=True) == larger  # 4,336 tokens leave no padding token in ``fits``
    del g._graphs[fits]
    assert g.key(4000, 30, 200, idle=True) == larger
    del g._graphs[larger]
    assert g.key(4000, 30, 200, idle=True) == own  # only one past COVER (or too few pairs / too short) is left
    assert g.stats()["covered_steps"] == 3


def test_an_idle_step_that_captures_also_captures_the_buckets_above_it(monkeypatch):
    """A new largest idle request captures its bucket and ``HEADROOM`` more above it, so the next
    larger request replays; a step under load captures only its own."""
    from adapters.runtimes.packed import buckets, graphs

    g = _cpu_graphs(monkeypatch)
    captured = []

    def capture(key):
        captured.append(key)
        return object()

    def launch(host, key, tokens, copy_in):  # the replay, stubbed (CUDA): capture on first use as _launch does
        if key not in g._graphs:
            g._graphs[key] = capture(key)
        return "logits", None

    monkeypatch.setattr(g, "_capture", capture)
    monkeypatch.setattr(g, "_launch", launch)
    key = buckets.bucket_key(9000, 60, 219)  # (9200, 64, 256): steps of 512 tokens
    g.launch(None, key, 9000, None, idle=True)
    assert captured == [key, (9712, 64, 256), (10224, 64, 256)][: 1 + graphs.HEADROOM]
    assert g.stats()["headroom_captures"] == graphs.HEADROOM
    g.launch(None, key, 9000, None, idle=True)  # replayed: nothing more
    g.launch(None, (11248, 64, 256), 11000, None)  # under load: its own only
    assert captured[1 + graphs.HEADROOM :] == [(11248, 64, 256)]


def test_a_covered_step_scores_as_its_own_bucket(replicas, monkeypatch):
    """Through the replica: the idle step padded to the borrowed bucket scores the same (the
    replay stubbed by the padded forward it would replay)."""
    from adapters.runtimes.packed import buckets, graphs

    replica, tok = replicas["bert"]
    prompts, segments = _step(tok, "bert")
    want = replica.score(prompts, segments)
    g = _cpu_graphs(monkeypatch, replica._forward, replica._offset)
    lens = [len(p) for p in prompts]
    own = buckets.bucket_key(sum(lens), len(lens), max(lens))
    borrowed = (buckets.token_bucket(own[0] + 1), 2 * own[1], 2 * own[2])
    g._graphs[borrowed] = object()
    used = []

    def launch(host, key, tokens, copy_in):
        used.append(key)
        return graphs.run_padded(replica._forward, host, key), _Done(), (key, 1, 0)

    monkeypatch.setattr(g, "_launch", launch)
    monkeypatch.setattr(replica, "graphs", g)
    got = replica.collect(replica.launch(prompts, segments, idle=True))
    assert used == [borrowed]
    assert len(got) == len(want)
    for g_row, w_row in zip(got, want, strict=True):
        assert g_row == pytest.approx(w_row, abs=1e-5)


def test_an_eager_step_bypasses_the_graphs(replicas, monkeypatch):
    """``launch(..., eager=True)`` (the retry of non-finite logits) neither replays nor captures."""
    replica, tok = replicas["bert"]
    prompts, segments = _step(tok, "bert")
    want = replica.score(prompts, segments)
    g = _cpu_graphs(monkeypatch, replica._forward, replica._offset)
    touched = []
    monkeypatch.setattr(g, "key", lambda *a, **k: touched.append(a))
    monkeypatch.setattr(replica, "graphs", g)
    assert replica.collect(replica.launch(prompts, segments, eager=True)) == want
    assert touched == []


def test_graphs_stay_off_when_a_replay_is_not_the_eager_forward():
    """The start-up check (``use_graphs``): bf16 rounding passes, a wrong replay or one that does
    not repeat keeps the engine eager, with the reason."""
    from adapters.runtimes.packed.graphs import replay_mismatch

    want = [[0.5], [-2.0], [3.0]]
    close = [[0.5039], [-2.0], [2.9961]]  # what padding's other GEMM kernels give in bf16
    assert replay_mismatch(want, close, close) is None
    assert (
        replay_mismatch([[40.0], [-1.0]], [[40.3], [-1.0]], [[40.3], [-1.0]]) is None
    )  # relative to the logits' scale
    wrong = [[0.5], [-2.0], [0.0]]
    assert (
        replay_mismatch(want, wrong, wrong) == "graph replay differs from the eager forward by 3 (repeat equal: True)"
    )
    assert "repeat equal: False" in replay_mismatch(want, close, want)


def test_no_bucket_is_larger_than_the_largest_graph(monkeypatch):
    """``max_tokens`` (the engine's ``token_bucket(batch_tokens + 1)``) bounds every graph: a step
    of up to ``max_tokens - 1`` tokens (one prompt over the budget) must not get a larger bucket.
    16 short of a multiple of the step, a bucket just past 16 x a power of two (8,432 = 16 x 512
    + 240) buckets again to the next step's size (token_bucket(8,432) = 8,688)."""
    import torch

    from adapters.runtimes.packed import buckets, graphs

    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)  # CPU: no pool
    for batch_tokens in (8180, 8190, 16000, 16370, 32760):
        top = buckets.token_bucket(batch_tokens + 1)
        step_graphs = graphs.StepGraphs(lambda *a: None, torch.device("cpu"), offset=0, max_tokens=top)
        for tokens in range(batch_tokens - 8, top + 8):
            key = step_graphs.key(tokens, 1, 64)
            assert key is None or key[0] <= top, (batch_tokens, tokens, key)
            if tokens <= batch_tokens:  # every step the budget makes has its graph
                assert key is not None and key[0] > tokens


class _Done:
    """A CUDA event's stand-in: the stubbed replay is done already."""

    def synchronize(self):
        pass


def test_a_replay_that_gives_pairs_non_finite_logits_is_recorded_where_they_lie(replicas, monkeypatch):
    """Non-finite logits from a graph step (seen on the H200 under load, cause not isolated): the
    collecting side records the bucket, the rows and token spans they came from and the graph's
    age in the stats (the engine scores those pairs again without a graph); finite steps leave
    no record."""
    import torch

    from adapters.runtimes.packed import buckets, graphs

    replica, tok = replicas["bert"]
    prompts, segments = _step(tok, "bert")
    g = _cpu_graphs(monkeypatch, replica._forward, replica._offset)
    spoil = []

    def launch(host, key, tokens, copy_in):
        out = graphs.run_padded(replica._forward, host, key)
        out[spoil] = float("nan")
        return out, _Done(), (key, 3, 41)

    monkeypatch.setattr(g, "_launch", launch)
    monkeypatch.setattr(replica, "graphs", g)
    want = replica.collect(replica.launch(prompts, segments))
    assert g.stats()["nonfinite_steps"] == 0 and g.stats()["recent_nonfinite"] == []
    spoil[:] = [1, 2]
    got = replica.collect(replica.launch(prompts, segments))
    assert got[0] == want[0] and all(not torch.isfinite(torch.tensor(got[i])).all() for i in (1, 2))
    (record,) = g.stats()["recent_nonfinite"]
    lens = [len(p) for p in prompts]
    key = buckets.bucket_key(sum(lens), len(lens), max(lens))
    assert g.stats()["nonfinite_steps"] == 1
    assert record["bucket"] == "x".join(map(str, key)) and record["pairs"] == len(lens) > 3
    assert record["bad_pairs"] == 2 and record["bad_rows"] == [[1, 2]]
    assert record["bad_token_spans"] == [[lens[0], sum(lens[:3]) - 1]]
    assert (record["graph_number"], record["graph_replays_before"]) == (3, 41)
