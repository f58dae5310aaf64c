"""Which waiting items fill the packed scheduler's next step, and what its runner gets for them.

``policy`` picks which request fills a step first: ``fifo`` (arrival order) or
``shortest-first`` (fewest tokens left first, so small requests overtake large ones). A step
takes items up to the token budget (``batch_tokens``) and ``max_items``; a prompt longer than the
budget still gets a step of its own, and where a request's next item does not fit, later
requests wait for the next step (so FIFO stays FIFO).

With ``share_prefix`` a step hands the runner each request's shared prompt part once, followed
by its documents' tails (``score_groups``), and the token budget counts the tokens computed: the
prefix once per request per step, plus every tail -- so a step holds more documents.

Apart from ``scheduler`` (its threads, lock and counters, the hand-over of scores) because this
is the batching policy and none of the machinery: plain functions over the queue's pending
requests (``pending.PendingRequest``), which the scheduler's workers call under its lock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from adapters.runtimes.packed.pending import PendingRequest

__all__ = ("assemble", "take")


def take(
    queue: Sequence[PendingRequest], *, policy: str, budget: int, max_items: int, share: bool, now: float
) -> tuple[list[tuple[PendingRequest, int]], list[PendingRequest]]:
    """Fill one step from ``queue`` (arrival order, not empty): the (request, item) pairs taken,
    each request's items together, and the requests this step starts (``started_at`` set to
    ``now``). Advances the requests' ``next`` and ``tokens_left``; the caller takes the requests
    with no item left off its queue."""
    order = queue if policy == "fifo" else sorted(queue, key=lambda r: r.tokens_left)
    taken: list[tuple[PendingRequest, int]] = []
    started: list[PendingRequest] = []
    tokens = 0
    for req in order:
        # Sharing: the budget counts computed tokens, the request's prefix once in this step.
        head = len(req.shared) if share else 0
        while req.next < len(req.items) and len(taken) < max_items:
            n = req.prompt_len(req.next)
            cost = head + n - len(req.shared) if share else n
            if taken and tokens + cost > budget:
                break  # a prompt longer than the budget still gets a step of its own
            taken.append((req, req.next))
            tokens += cost
            head = 0
            req.next += 1
            req.tokens_left -= n
            if req.started_at is None:
                req.started_at = now
                started.append(req)
        if req.next < len(req.items):
            break  # budget full: later requests wait, so FIFO stays FIFO
    return taken, started


def assemble(
    taken: list[tuple[PendingRequest, int]], share: bool
) -> tuple[list[Any], list[int | None] | None, tuple[int, int]]:
    """The step's work for the runner -- whole prompts with their token-type starts, or (shared,
    tails) per request (``take`` keeps each request's items together) -- and its (prompt,
    computed) token counts."""
    prompt_tokens = sum(r.prompt_len(i) for r, i in taken)
    if not share:
        return (
            [[*r.shared, *r.items[i], *r.suffix] for r, i in taken],
            [r.segment for r, _ in taken],
            (prompt_tokens, prompt_tokens),
        )
    groups: list[tuple[Any, list[list[int]]]] = []
    last: PendingRequest | None = None
    for r, i in taken:
        if r is not last:
            groups.append((r.shared, []))
            last = r
        groups[-1][1].append(r.tail(i))
    computed = sum(len(p) + sum(map(len, tails)) for p, tails in groups)
    return groups, None, (prompt_tokens, computed)
