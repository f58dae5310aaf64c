"""Continuous batching across HTTP requests: one shared queue, one worker thread per device
(two on CUDA: one launches steps, one collects them; ``_launch_loop`` says why).

Each worker, when its device is free, fills its next step from the items of *every* waiting
request, up to a token budget, runs it, and hands each finished request its scores on the
event loop's thread. Consequences:

- concurrent requests share steps (the stats count requests per step to show it);
- a request that arrives alone starts at once: a worker blocks on a condition variable and wakes
  when an item is queued -- there is no batching window;
- several devices balance themselves: an idle worker takes the next items, so one large
  request is split across devices and many requests spread over them;
- cancelling a request removes its items that no step has taken yet.

Which items fill a step -- ``policy`` (``fifo`` or ``shortest-first``), the token budget,
``share_prefix`` (each request's shared prompt part computed once per step) -- and what the
runner gets for them is :mod:`.filling`; this module is the machinery that runs the steps.

Pure Python (threads, no torch): a runner is anything with ``device`` and
``score(prompts, segments) -> list``, one output per prompt (a float for Qwen3, a row of logits
for a cross-encoder; ``segments`` gives, per prompt, where token type 1 starts -- a BERT pair's
document -- or None), and ``score_groups(groups)`` for ``share_prefix`` (Qwen3 only). A
``pipelined`` runner has ``launch(prompts, segments, idle=..., eager=...)`` (``launch_groups(groups,
idle=..., eager=...)``) and ``collect(handle)`` instead; ``idle`` says that no request waits
behind the step, ``eager`` that the step holds a request submitted with ``eager``.
"""

from __future__ import annotations

import asyncio
import collections
import math
import threading
import time
from collections.abc import Sequence
from typing import Any, Protocol

from adapters.runtimes.packed import filling
from adapters.runtimes.packed.pending import PendingRequest

__all__ = ("PackedScheduler", "Runner")


class Runner(Protocol):
    device: Any

    def score(self, prompts: Sequence[Sequence[int]], segments: Sequence[int | None] | None = None) -> list[Any]: ...

    # Only with share_prefix: [(shared, [item + suffix, ...]), ...] -> one score per tail, in order.
    def score_groups(self, groups: Sequence[tuple[Sequence[int], Sequence[Sequence[int]]]]) -> list[float]: ...


class _Lane:
    """A pipelined runner's launched steps, in order, until its collector has finished them
    (guarded by the scheduler's lock)."""

    __slots__ = ("launching", "out", "steps")

    def __init__(self) -> None:
        self.steps: collections.deque[Any] = collections.deque()  # (taken, tokens, handle, error, t0, prep)
        self.out = 0  # steps taken by the launcher and not yet finished by the collector
        self.launching = True  # False once the launcher has ended (stop)


class PackedScheduler:
    def __init__(
        self,
        runners: Sequence[Runner],
        *,
        batch_tokens: int,
        max_items: int,
        policy: str = "fifo",
        error_type: type[Exception] = RuntimeError,
        share_prefix: bool = False,
    ) -> None:
        self._runners = list(runners)
        self._budget, self._max_items, self._policy = batch_tokens, max_items, policy
        self._share = share_prefix
        self._error_type = error_type
        self._queue: list[PendingRequest] = []  # requests with items not yet taken, arrival order
        self._cond = threading.Condition()
        self._stopping = False
        # Counters (read by ``stats``; written under the lock).
        self.steps_by_requests: collections.Counter[int] = collections.Counter()
        # tokens: prompt tokens served; computed_tokens: those the steps computed (shared prefixes once)
        self._dev = [
            {
                "device": str(getattr(r, "label", r.device)),
                "steps": 0,
                "items": 0,
                "tokens": 0,
                "computed_tokens": 0,
                "busy_s": 0.0,
                "prep_s": 0.0,
                "wait_s": 0.0,
            }
            for r in runners
        ]
        # (host prep, device wait) of the latest steps, for their percentiles: a mean hides a tail
        self._recent: collections.deque[tuple[float, float]] = collections.deque(maxlen=1024)
        self._requests = 0
        self._queue_s = 0.0
        self._step_s: float | None = None  # recent step duration, a moving average (expected_wait_s)
        self._engine_s = 0.0  # submit -> last score, summed over finished requests
        self._finished = 0
        self._dropped = 0
        self._lanes = [_Lane() for _ in runners]
        names = [f"packed-{getattr(r, 'label', r.device)}" for r in runners]
        self._threads = [
            threading.Thread(target=self._work, args=(i,), name=names[i], daemon=True)
            for i in range(len(self._runners))
        ]
        self._threads += [
            threading.Thread(target=self._collect_loop, args=(i,), name=f"{names[i]}-collect", daemon=True)
            for i, r in enumerate(self._runners)
            if getattr(r, "pipelined", False)
        ]
        for t in self._threads:
            t.start()

    # -- event-loop side --------------------------------------------------------------------
    def submit(
        self,
        shared: Sequence[int],
        items: Sequence[Sequence[int]],
        suffix: Sequence[int],
        segment: int | None = None,
        *,
        eager: bool = False,
    ) -> PendingRequest:
        """Queue a request; ``eager``: every step holding one of its items is launched eagerly, not
        as a CUDA graph (a pipelined runner's ``launch(..., eager=True)``; the packed engine's
        second try of non-finite logits)."""
        loop = asyncio.get_running_loop()
        req = PendingRequest(shared, items, suffix, loop, loop.create_future(), segment, eager)
        if not items:
            req.future.set_result([])
            return req
        with self._cond:
            if self._stopping:
                raise self._error_type("engine is stopping")
            self._queue.append(req)
            # all: one condition serves every device's launcher and collector
            self._cond.notify_all()
        return req

    def cancel(self, req: PendingRequest) -> None:
        """Drop the request's items no step has taken; steps already running finish and are ignored."""
        with self._cond:
            if req.cancelled:
                return
            req.cancelled = True
            if req in self._queue:
                self._queue.remove(req)
                self._dropped += len(req.items) - req.next

    def stop(self, timeout: float = 30.0) -> None:
        with self._cond:
            self._stopping = True
            pending, self._queue = self._queue, []
            self._cond.notify_all()
        for req in pending:
            req.resolve(self._error_type("engine stopped"))
        for t in self._threads:
            t.join(timeout)

    def queue_depth(self) -> int:
        """Requests no step has started yet (``rerank_queued_requests``; a chain's spill-over)."""
        with self._cond:
            return sum(1 for r in self._queue if r.started_at is None)

    def expected_wait_s(self) -> float:
        """Seconds a request submitted now would wait for its first step: the prompt tokens queued ahead
        of it over the step budget (steps to go), times the recent step time, over the devices; 0
        before any step ran. Read by a chain's spill-over (``gateway.serving.routing.saturation``)."""
        with self._cond:
            queued = sum(r.tokens_left for r in self._queue)
            step_s = self._step_s
        if not queued or step_s is None:
            return 0.0
        return -(-queued // self._budget) * step_s / len(self._runners)

    def stats(self) -> dict[str, Any]:
        with self._cond:
            steps = sum(d["steps"] for d in self._dev)
            busy = sum(d["busy_s"] for d in self._dev)
            return {
                "policy": self._policy,
                "batch_tokens": self._budget,
                "share_prefix": self._share,
                "requests": self._requests,  # submits: an idle request in parts counts one per part
                "steps": steps,
                "waiting_requests": len(self._queue),
                "dropped_items": self._dropped,
                # Queue: submit -> first step holding one of its items; step: one forward pass.
                "queue_s_total": self._queue_s,
                "finished": self._finished,
                "engine_s_total": self._engine_s,
                "queue_ms_mean": 1e3 * self._queue_s / self._requests if self._requests else 0.0,
                "step_ms_mean": 1e3 * busy / steps if steps else 0.0,
                # A step's host side (assemble + pack + launch; whole steps: assemble only) and its
                # wait for the device (collect; whole steps: the forward) -- the rest of a request's
                # engine time is queue and handing results back.
                "prep_ms_mean": 1e3 * sum(d["prep_s"] for d in self._dev) / steps if steps else 0.0,
                "wait_ms_mean": 1e3 * sum(d["wait_s"] for d in self._dev) / steps if steps else 0.0,
                # the same over the latest (up to 1,024) steps: p50 / p99 / max
                "recent_steps_ms": _percentiles(self._recent),
                # {requests with items in one step: number of such steps}
                "steps_by_requests": {str(k): v for k, v in sorted(self.steps_by_requests.items())},
                "prompt_tokens": sum(d["tokens"] for d in self._dev),
                "computed_tokens": sum(d["computed_tokens"] for d in self._dev),
                "devices": [dict(d) for d in self._dev],
            }

    # -- worker threads ---------------------------------------------------------------------
    def _take(self) -> list[tuple[PendingRequest, int]]:
        """Fill one step (called under the lock, queue not empty): ``filling.take``; the requests it
        starts are counted here, and those with no item left leave the queue."""
        now = time.perf_counter()
        taken, started = filling.take(
            self._queue, policy=self._policy, budget=self._budget, max_items=self._max_items, share=self._share, now=now
        )
        for req in started:
            self._requests += 1
            self._queue_s += now - req.queued_at
        self._queue = [r for r in self._queue if r.next < len(r.items)]
        return taken

    def _work(self, index: int) -> None:
        runner, counters = self._runners[index], self._dev[index]
        if getattr(runner, "pipelined", False):
            self._launch_loop(index)
            return
        while True:  # whole steps (CPU): take, run, finish
            with self._cond:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                taken = self._take()
                if self._queue:
                    self._cond.notify_all()  # more work: wake another idle device
            tp = time.perf_counter()
            work, segments, tokens = filling.assemble(taken, self._share)
            t0 = time.perf_counter()
            score = runner.score_groups if self._share else runner.score
            try:
                out = score(work) if self._share else score(work, segments)  # type: ignore[arg-type]
                self._finish(counters, runner, taken, tokens, out, None, t0, t0 - tp)
            except Exception as exc:  # noqa: BLE001  # fail this step's requests, keep serving
                self._finish(counters, runner, taken, tokens, None, exc, t0, t0 - tp)

    def _launch_loop(self, index: int) -> None:
        """A pipelined runner (CUDA) splits a step into launch (host prep + queued kernels, returns
        before they ran) and collect (wait for the scores). This thread launches; a collector
        thread (``_collect_loop``) waits for each step in turn and hands its scores over.

        Why two threads: a launcher that also collected sat blocked in the oldest step's collect
        while work queued behind it, so the device idled from that step's end until the next was
        prepared and launched. That is the idle case of a request submitted in parts
        (``overlap_tokenizing``): each part arrives while the one before it computes. Now the next
        step is prepared and queued on the device as soon as it is queued here, up to ``depth``
        + 1 steps launched and not yet collected (``depth``: the runner's ``in_flight``, one per
        pipeline stage), so the host prepares step k+1 while the device computes step k.
        """
        lane = self._lanes[index]
        try:
            self._launch_steps(index, lane)
        finally:  # stopping (or a bug here): the collector drains what is out, then ends
            with self._cond:
                lane.launching = False
                self._cond.notify_all()

    def _launch_steps(self, index: int, lane: _Lane) -> None:
        runner = self._runners[index]
        depth = max(1, int(getattr(runner, "in_flight", 1)))
        while True:
            with self._cond:
                while not self._stopping and (not self._queue or lane.out > depth):
                    self._cond.wait()
                if self._stopping:
                    return
                taken = self._take()
                # Nothing waits behind this step: the runner may spare it a CUDA graph capture
                # (graphs.py says how and why).
                idle = not self._queue
                eager = any(r.eager for r, _ in taken)
                if self._queue:
                    self._cond.notify_all()
                lane.out += 1
            tp = time.perf_counter()
            work, segments, tokens = filling.assemble(taken, self._share)
            t0 = time.perf_counter()
            launch = runner.launch_groups if self._share else runner.launch  # type: ignore[attr-defined]
            handle, error = None, None
            try:
                handle = (
                    launch(work, idle=idle, eager=eager)
                    if self._share
                    else launch(work, segments, idle=idle, eager=eager)
                )
            except Exception as exc:  # noqa: BLE001  # fails this step's requests when collected
                error = exc
            with self._cond:
                lane.steps.append((taken, tokens, handle, error, t0, time.perf_counter() - tp))
                self._cond.notify_all()

    def _collect_loop(self, index: int) -> None:
        """Collect a pipelined runner's launched steps, oldest first; ends once its launcher has
        ended and every launched step is collected."""
        runner, counters, lane = self._runners[index], self._dev[index], self._lanes[index]
        while True:
            with self._cond:
                while not lane.steps and lane.launching:
                    self._cond.wait()
                if not lane.steps:
                    return
                taken, tokens, handle, error, t0, prep = lane.steps.popleft()
            scores = None
            tw = time.perf_counter()
            if error is None:
                try:
                    scores = runner.collect(handle)  # type: ignore[attr-defined]
                except Exception as exc:  # noqa: BLE001
                    error = exc
            try:
                self._finish(counters, runner, taken, tokens, scores, error, t0, prep, tw)
            except Exception as exc:  # noqa: BLE001  # scores that do not fit the step: fail it, as whole steps do
                # (escaping, it would end this thread: the step's requests never answered, and
                # the launcher, its lane never freed, would launch nothing more on this device)
                self._finish(counters, runner, taken, tokens, None, exc, t0, prep, tw)
            with self._cond:
                lane.out -= 1
                self._cond.notify_all()  # a slot is free: the launcher may go on

    def _finish(
        self,
        counters: dict[str, Any],
        runner: Runner,
        taken: list[tuple[PendingRequest, int]],
        tokens: tuple[int, int],
        scores: list[Any] | None,
        error: BaseException | None,
        t0: float,
        prep: float = 0.0,
        wait_from: float | None = None,
    ) -> None:
        """Count one step and hand its scores (or its error) to the requests it served.

        ``t0``: the step's start (after assembling); ``prep``: its host preparation; ``wait_from``:
        when its collect began (None: a whole step, its forward counted as the wait)."""
        end = time.perf_counter()
        dt = end - t0
        finished: list[PendingRequest] = []
        failed: list[PendingRequest] = []
        with self._cond:
            counters["steps"] += 1
            counters["items"] += len(taken)
            counters["tokens"] += tokens[0]
            counters["computed_tokens"] += tokens[1]
            counters["busy_s"] += dt
            counters["prep_s"] += prep
            counters["wait_s"] += end - (t0 if wait_from is None else wait_from)
            self._recent.append((prep, end - (t0 if wait_from is None else wait_from)))
            self._step_s = dt if self._step_s is None else 0.9 * self._step_s + 0.1 * dt
            self.steps_by_requests[len({id(r) for r, _ in taken})] += 1
            for k, (req, i) in enumerate(taken):
                if req.cancelled or req.future.done():
                    continue
                if scores is None:
                    req.cancelled = True  # its remaining items are not worth computing
                    if req in self._queue:
                        self._queue.remove(req)
                        self._dropped += len(req.items) - req.next  # as a cancel counts them
                    failed.append(req)
                    continue
                req.scores[i] = scores[k]
                req.done += 1
                if req.done == len(req.items):
                    finished.append(req)
                    self._finished += 1
                    self._engine_s += time.perf_counter() - req.queued_at
        for req in finished:
            req.resolve(req.scores)
        for req in failed:
            req.resolve(self._error_type(f"forward pass failed on {runner.device}: {type(error).__name__}: {error}"))


def _percentiles(steps: Sequence[tuple[float, float]]) -> dict[str, dict[str, float]]:
    """{"prep"/"wait": {"p50", "p99", "max"}} in ms (nearest rank), over ``steps``' (prep, wait) seconds."""
    out: dict[str, dict[str, float]] = {}
    for k, name in enumerate(("prep", "wait")):
        xs = sorted(1e3 * s[k] for s in steps)
        if xs:
            out[name] = {
                "p50": round(xs[math.ceil(0.5 * len(xs)) - 1], 3),
                "p99": round(xs[math.ceil(0.99 * len(xs)) - 1], 3),
                "max": round(xs[-1], 3),
            }
    return out
