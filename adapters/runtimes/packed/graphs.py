"""CUDA graphs of a packed cross-encoder's forward: one launch per step instead of ~300.

Why: a packed step is ~10 Python-level kernel launches per layer (GEMMs, varlen attention,
compiled pointwise regions). Alone on the GPU that host work hides behind the device's, but
under 16 clients the worker thread that launches shares the GIL with every request's HTTP and
tokenizing: on the H200 its host prep grew to about a step's device time (report
gpu-h200-2026-12-01-e: 31 ms mean, ~80 ms for the loaded steps), so the GPU waited on Python.
A captured graph is replayed with one call, whatever the GIL is doing.

A graph has fixed shapes, so a step is padded to a bucket (``StepGraphs.key``; the rule and why
the padding is inert: :mod:`.buckets`).

Graphs are captured on first use of a bucket; requests of one shape fall in a handful of
buckets, partial steps under load in more (8-13 in report f), and the engine's stats count
captures. They share one memory pool, so they cost about one step's activations in all.

What an idle request pays for a capture (the d100 idle p99 of report gpu-h200-2026-12-02-c was
one or two captures per 100 requests: a request's parts vary in token count, so new buckets kept
appearing after a 160-request warm pass):

- A capture records on a stream of its own, without what ``torch.cuda.graph`` does first
  (synchronize the device, collect garbage, empty both caching allocators: 37 ms a capture on
  average on the H200); recording alone took 9.2 ms for a bucket of a (pairs, max length) class
  met before. The first capture of a class also runs the step once (lazy initialisation).
- An idle step (the scheduler's ``idle``: no request waits behind it) of a bucket with no graph
  replays the smallest captured graph that holds it with at most ``COVER`` times its bucket's
  tokens (or 512 more) instead (``covered_steps``): a step below the largest seen so far pads a
  little more.
  Run eagerly instead it cost far more: ~17 ms of host launches a step, 47.5 ms p50 a d100
  request (report gpu-h200-2026-12-02-d).
- An idle step that does capture (a request larger than any so far) also captures the
  ``HEADROOM`` buckets above its own, after its replay is queued (the device computes the step
  meanwhile), so the next larger request finds a graph. Replayed over the bench's workloads
  (16 seeds, 160 requests then 100), that left at most one capture per 100 idle requests,
  against up to two capturing each bucket alone.

Under load (requests wait behind the step) a step captures its own bucket, as before: it
happens once per bucket, and padding would cost every later step.

Each replay's logits are copied to pinned host memory right behind it on the stream, so a
later replay (the scheduler launches step k+1 before collecting step k) cannot overwrite them.
At start the engine checks a replay against the eager forward on the same pairs and keeps
graphs only if they agree (``check``).

Imported only through ``pair_replica`` (pulls in torch).
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import time
from collections.abc import Callable
from typing import Any

import torch

from adapters.runtimes.packed.buckets import Key, bucket_key, token_bucket

__all__ = (
    "COVER",
    "HEADROOM",
    "CaptureError",
    "StepGraphs",
    "replay_mismatch",
    "run_padded",
)

# (ids, positions, per-token row, cumulative lengths, max length, host lengths) -> logits
Forward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, Any], torch.Tensor]

# An idle step may replay a graph of up to this many times its own bucket's tokens, or 512 more
# (a small step's buckets are 256 tokens apart; 512 tokens cost an XLM-R large step well under
# a millisecond on an H200) (module docstring). 0: no covering (gpu_encoders' packed-nocover).
COVER = 1.25
_COVER_TOKENS = 512
# Buckets above an idle step's new one captured with it (module docstring).
HEADROOM = 2


class CaptureError(RuntimeError):
    """A bucket's graph could not be captured (out of memory, an op capture refuses): that bucket
    runs eagerly from then on; the engine keeps serving."""


def run_padded(forward: Forward, inputs: torch.Tensor, key: Key) -> torch.Tensor:
    """``forward`` on a step in ``key``'s padded layout (``PackedPairReplica._pack(pad=key[:2])``):
    float32 logits, one row per pair slot (the first ``pairs`` rows are the real pairs')."""
    t, n, max_len = key
    return forward(
        inputs[:t], inputs[t : 2 * t], inputs[2 * t : 3 * t], inputs[3 * t : 3 * t + n + 1], max_len, None
    ).float()


def replay_mismatch(want: list[list[float]], got: list[list[float]], again: list[list[float]]) -> str | None:
    """Why a graph's logits (``got``, then ``again`` replayed once more) cannot stand in for the eager
    forward's (``want``), or None. Padding changes the GEMMs' shapes, so cuBLAS may pick other
    kernels: equal within half-precision rounding, not bit for bit; a broken capture is off by far
    more, and a replay must repeat exactly."""
    scale = max(1.0, max(abs(x) for row in want for x in row))
    diff = max(abs(a - b) for r, s in zip(got, want, strict=True) for a, b in zip(r, s, strict=True))
    if got != again or diff > 2e-2 * scale:
        return f"graph replay differs from the eager forward by {diff:.3g} (repeat equal: {got == again})"
    return None


class _Graph:
    __slots__ = ("graph", "inputs", "number", "out", "replays")

    def __init__(self, graph: torch.cuda.CUDAGraph, inputs: torch.Tensor, out: torch.Tensor, number: int) -> None:
        self.graph, self.inputs, self.out = graph, inputs, out
        self.number = number  # the how-manieth capture of the replica (from 1)
        self.replays = 0


# A replay as ``nonfinite`` records it: (bucket, capture number, the graph's replays before it)
Replay = tuple[Key, int, int]


class StepGraphs:
    """The captured graphs of one replica, by bucket; ``launch`` replays one and queues its logits' copy home.

    ``forward`` is the replica's eager forward (varlen attention: no host lengths); ``offset`` the
    position id padding tokens get (any valid one); ``max_tokens`` the largest step captured (a
    larger one runs eagerly); ``limit`` how many graphs are captured at most (see ``key``).
    """

    def __init__(
        self, forward: Forward, device: torch.device, *, offset: int, max_tokens: int, limit: int = 64
    ) -> None:
        self._forward, self.device, self._offset = forward, device, offset
        self.max_tokens, self._limit = max_tokens, limit
        self._graphs: dict[Key, _Graph] = {}
        self._pool = torch.cuda.graph_pool_handle()
        self.captures = 0
        self.capture_s = 0.0
        self.replays = 0
        self.tokens = 0  # real tokens replayed
        self.padded = 0  # padding tokens replayed
        self.eager_steps = 0  # steps run eagerly: a new bucket past ``limit``, or one whose capture failed
        self.covered_steps = 0  # idle steps replayed in a larger captured bucket than their own
        self.headroom_captures = 0  # buckets captured above an idle step's new one
        self._stream: torch.cuda.Stream | None = None  # captures and their warm runs (made on the first capture)
        self.failed: dict[Key, str] = {}  # bucket -> why its capture failed
        # bucket -> why its first capture (without a run of its own) failed; captured after one
        self.recaptured: dict[str, str] = {}
        self._warmed: set[tuple[int, int]] = set()  # (pairs, max length) classes run once before a capture
        self.nonfinite_steps = 0  # replays that gave a real pair a non-finite logit (``nonfinite``)
        self.recent_nonfinite: collections.deque[dict[str, Any]] = collections.deque(maxlen=8)

    def key(self, tokens: int, pairs: int, max_len: int, *, idle: bool = False) -> Key | None:
        """The bucket a step of this shape runs in, or None when it runs eagerly: too large for a
        graph, or a new bucket once ``limit`` graphs exist (never evicting: a workload of more
        shapes than that would otherwise capture again and again). ``idle``: a captured larger
        bucket within ``COVER`` rather than a capture (the module docstring says why)."""
        key = bucket_key(tokens, pairs, max_len)
        # The bucket, not tokens + 1: a bucket is 16 short of a multiple of its step, so a step
        # just under ``max_tokens`` may bucket past it (token_bucket(8,432) = 8,688).
        if key[0] > self.max_tokens:
            return None
        if key in self._graphs:
            return key
        if idle:
            cover = self._cover(tokens, pairs, max_len, max(COVER * key[0], key[0] + _COVER_TOKENS) if COVER else 0)
            if cover is not None:
                self.covered_steps += 1
                return cover
        if key in self.failed or len(self._graphs) >= self._limit:
            self.eager_steps += 1
            return None
        return key

    def _cover(self, tokens: int, pairs: int, max_len: int, most: float) -> Key | None:
        """The smallest captured bucket that holds the step with a padding token and an empty pair
        to spare (what ``bucket_key`` guarantees) and at most ``most`` tokens."""
        fits = [k for k in list(self._graphs) if tokens < k[0] <= most and k[1] > pairs and k[2] >= max_len]
        return min(fits, default=None)

    def stats(self) -> dict[str, Any]:
        return {
            "graphs": len(self._graphs),
            "captures": self.captures,
            "capture_ms_total": round(1e3 * self.capture_s, 1),
            "replays": self.replays,
            "eager_steps": self.eager_steps,
            "covered_steps": self.covered_steps,
            "headroom_captures": self.headroom_captures,
            # a list first: the worker thread may add a failure while /ready reads this
            "failed_captures": {"x".join(map(str, k)): why for k, why in list(self.failed.items())},
            "captured_after_a_warm_run": dict(list(self.recaptured.items())),
            "padding_share": round(self.padded / (self.tokens + self.padded), 4) if self.replays else 0.0,
            "nonfinite_steps": self.nonfinite_steps,
            "recent_nonfinite": list(self.recent_nonfinite),
        }

    def nonfinite(self, replay: Replay, bad: list[int], lens: list[int]) -> None:
        """Record a replay whose real pairs ``bad`` (row numbers) got a non-finite logit, with what
        tells a memory fault from an input one: the bucket, where in the step the rows lie (their
        token offsets against the step's), how old the graph was. Called by the collecting thread;
        the engine scores those pairs again without a graph (``PackedEncoderEngine.score``)."""
        key, number, replays = replay
        starts = list(itertools.accumulate(lens, initial=0))
        rows = _spans(bad)
        self.nonfinite_steps += 1
        self.recent_nonfinite.append(
            {
                "bucket": "x".join(map(str, key)),
                "pairs": len(lens),
                "tokens": starts[-1],
                "bad_pairs": len(bad),
                "bad_rows": rows,
                "bad_token_spans": [[starts[a], starts[b + 1] - 1] for a, b in rows],
                "graph_number": number,
                "graphs": len(self._graphs),
                "graph_replays_before": replays,
                "at_replay": self.replays,
                "unix_s": round(time.time(), 3),
            }
        )

    def _run(self, inputs: torch.Tensor, key: Key) -> torch.Tensor:
        return run_padded(self._forward, inputs, key)

    def _capture(self, key: Key) -> _Graph:
        t, n, _ = key
        inputs = torch.zeros(3 * t + n + 1, dtype=torch.long, device=self.device)
        inputs[t : 2 * t] = (
            self._offset
        )  # valid positions; every pair empty: the kernels' launch shapes are what counts
        t0 = time.perf_counter()
        # One stream for every capture, and nothing but captures on it: see the warm run below.
        stream = self._stream = self._stream or torch.cuda.Stream(self.device)
        main = torch.cuda.current_stream(self.device)
        # The first capture of a (pairs, max length) class runs the step once outside the capture:
        # lazy initialisation and any compilation happen there, not in the graph. Later buckets of
        # the class differ only in the token count, which the compiled regions take symbolically
        # (dynamic=True) and the kernels as a launch size, so they skip that run: it was most of a
        # capture's ~90 ms under load (a whole forward). One whose capture fails is warmed and
        # captured once more; a bucket that still fails runs eagerly (CaptureError).
        # It runs on the main stream, behind the step in flight, not on the capture stream as
        # PyTorch's docs do: PyTorch keeps a cuBLAS workspace per stream and every graph keeps its
        # capture stream's, so eager GEMMs there could write that workspace while earlier graphs
        # replay on the main stream. The H200 showed no corruption from it with these GEMMs
        # (report gpu-h200-2026-12-03) and the rare non-finite
        # steps under load went on without it (``nonfinite`` records them); it stays a hazard
        # this ordering removes for the cost of one forward per class on the main stream.
        warmed_now = key[1:] not in self._warmed
        if warmed_now:
            self._warm(inputs, key, main)
            self._warmed.add(key[1:])
        try:
            graph, out = self._record(inputs, key, stream, main)
        except Exception as exc:
            if warmed_now or isinstance(exc, torch.cuda.OutOfMemoryError):
                raise
            # A later bucket of a warmed class, captured without a run of its own, failed: the
            # capture may have met what only a run outside it does (a compiled region compiling
            # for this token count). Run it once outside, as a class's first capture does, and
            # capture again; a second failure is the bucket's (``failed``, eager from then on).
            self.recaptured["x".join(map(str, key))] = f"{type(exc).__name__}: {exc}"[:300]
            self._warm(inputs, key, main)
            graph, out = self._record(inputs, key, stream, main)
        main.wait_stream(stream)  # replays on the main stream come after the capture
        self.captures += 1
        self.capture_s += time.perf_counter() - t0
        return _Graph(graph, inputs, out, self.captures)

    def _warm(self, inputs: torch.Tensor, key: Key, main: Any) -> None:
        """The step once outside any capture, on the main stream (see ``_capture``)."""
        self._run(inputs, key)
        # The warm run's activations are cached blocks of the ordinary allocator, which the
        # graphs' pool cannot reuse: release them, as ``torch.cuda.graph`` does before every
        # capture (without it the engine held 14.1 GB instead of 6.3 after its 64k-token start
        # step, report gpu-h200-2026-12-02-c). Once per class, where a whole forward runs anyway.
        main.synchronize()
        torch.cuda.empty_cache()

    def _record(self, inputs: torch.Tensor, key: Key, stream: Any, main: Any) -> tuple[Any, torch.Tensor]:
        """Capture the step on ``stream``: (the graph, its output tensor)."""
        stream.wait_stream(main)  # ``inputs`` is written on the main stream
        graph = torch.cuda.CUDAGraph()
        # ``capture_begin``/``capture_end`` as ``torch.cuda.graph`` calls them, without what that
        # context manager does first: synchronize the device (wait for the step in flight), collect
        # garbage and empty the device and pinned-host caches (the next steps then allocate
        # afresh). Recording queues nothing, so the device keeps computing the step in flight.
        # thread_local: the collector thread (and another device's launcher) use CUDA meanwhile.
        with torch.cuda.stream(stream):
            graph.capture_begin(pool=self._pool, capture_error_mode="thread_local")
            try:
                out = self._run(inputs, key)
            except BaseException:
                self._end_capture(graph, failed=True)  # the run's error says why: it is the one raised
                raise
            self._end_capture(graph, failed=False)
        return graph, out

    def _end_capture(self, graph: Any, failed: bool) -> None:
        """``graph.capture_end()``, with the caching allocator's routing into the pool ended even
        when it raises. torch 2.11's ``CUDAGraph::capture_end`` checks ``cudaStreamEndCapture``'s
        error before it ends that routing, so a capture that failed left it on and every later
        capture of the replica failed with "beginAllocateToPool: already recording to mempool_id"
        (H100, 2026-12-05): one bucket that could not be captured made every later bucket eager.
        Newer torch ends the routing first; ending it twice raises "not currently recording",
        which is ignored. ``failed``: the capture's run raised, and that error, not capture_end's
        "previous error during capture", is the one the caller records."""
        try:
            graph.capture_end()
        except Exception:
            with contextlib.suppress(Exception):  # already ended (a torch that ends it first)
                torch._C._cuda_endAllocateToPool(torch.cuda.current_device(), self._pool)
            if not failed:
                raise

    def launch(
        self,
        host: torch.Tensor,
        key: Key,
        tokens: int,
        copy_in: Callable[[torch.Tensor, torch.Tensor], None],
        *,
        idle: bool = False,
    ) -> tuple[torch.Tensor, Any, Replay]:
        """Replay ``key``'s graph on ``host`` (``_pack``'s padded layout; ``copy_in(dst, host)``
        queues its copy to the device); returns pinned host logits, the event after their copy
        and which replay it was (for ``nonfinite``).
        An ``idle`` step that captures ``key`` then captures the ``HEADROOM`` buckets above it."""
        with torch.cuda.device(self.device):
            new = key not in self._graphs
            out = self._launch(host, key, tokens, copy_in)
            if new and idle:
                self._capture_headroom(key)
            return out

    def _capture_headroom(self, key: Key) -> None:
        """Capture the ``HEADROOM`` token buckets above ``key`` (same pairs and max length) that
        have no graph yet; one that fails runs eagerly from then on, as any bucket whose capture
        failed (``failed`` says why), and the step that asked is served already."""
        t = key[0]
        for _ in range(HEADROOM):
            t = token_bucket(t + 1)
            up = (t, *key[1:])
            if t > self.max_tokens or len(self._graphs) >= self._limit:
                return
            if up in self._graphs or up in self.failed:
                continue
            try:
                self._graphs[up] = self._capture(up)
                self.headroom_captures += 1
            except Exception as exc:  # noqa: BLE001  # this step is served already: record it and go on
                self.failed[up] = f"{type(exc).__name__}: {exc}"[:300]
                if isinstance(exc, torch.cuda.OutOfMemoryError):
                    torch.cuda.empty_cache()
                return

    def _launch(
        self, host: torch.Tensor, key: Key, tokens: int, copy_in: Callable[[torch.Tensor, torch.Tensor], None]
    ) -> tuple[torch.Tensor, Any, Replay]:
        g = self._graphs.get(key)
        if g is None:
            try:
                g = self._graphs[key] = self._capture(key)
            except Exception as exc:
                self.failed[key] = f"{type(exc).__name__}: {exc}"[:300]
                self.eager_steps += 1  # this step too: the replica runs it eagerly
                if isinstance(exc, torch.cuda.OutOfMemoryError):
                    torch.cuda.empty_cache()
                raise CaptureError(self.failed[key]) from exc
        copy_in(g.inputs, host)
        g.graph.replay()
        replay = (key, g.number, g.replays)
        g.replays += 1
        out = torch.empty(g.out.shape, dtype=g.out.dtype, pin_memory=True)
        out.copy_(g.out, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        self.replays += 1
        self.tokens += tokens
        self.padded += key[0] - tokens
        return out, done, replay


def _spans(xs: list[int]) -> list[list[int]]:
    """Sorted ints as [first, last] runs: [0, 1, 2, 5] -> [[0, 2], [5, 5]]."""
    runs: list[list[int]] = []
    for x in xs:
        if runs and x == runs[-1][1] + 1:
            runs[-1][1] = x
        else:
            runs.append([x, x])
    return runs
