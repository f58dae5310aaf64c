"""Passive health of a set of interchangeable members: who is ejected, for how long, and when they return.

One implementation for both places that route around failing members: a pool's replicas
(:mod:`adapters.upstreams.pool`) and a fallback chain's targets (``gateway.serving.routing``).
It is Envoy's outlier detection: ``eject_after_failures`` consecutive failures eject a member
for a cooldown (:func:`cooldown_for`: doubled each time it is ejected again before it has
answered, capped); once the cooldown is over, a probe (the caller's: an HTTP health check for a
replica, the model's state for a chain target) readmits it; at most ``max_ejected_share`` of the
members are out at once, so whole-set trouble (overload) does not turn into refusals for a whole
cooldown. Only the bookkeeping is here; calling members and probing them is the caller's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

import structlog

__all__ = ("Member", "OutlierPolicy", "Outliers", "cooldown_for")


class Member:
    """What passive health knows about one member (a pool's :class:`~adapters.upstreams.replicas.Replica`
    subclasses it; a chain target is one)."""

    __slots__ = ("capped", "consecutive_failures", "ejected_until", "ejections", "probe", "shown")

    def __init__(self, shown: str) -> None:
        # What log lines and /ready call it (never a secret: a replica's URL is redacted first).
        self.shown = shown
        self.consecutive_failures = 0
        # True while the ejection cap keeps this failing member in rotation: the cap is logged
        # when this turns True, not at each failed call or probe while it stays so.
        self.capped = False
        # None while admitted; the time its cooldown ends (on the set's clock) while ejected.
        self.ejected_until: float | None = None
        # Ejections since its last answered call: the next one lasts cooldown_for(ejections + 1).
        self.ejections = 0
        self.probe: asyncio.Task[None] | None = None

    @property
    def admitted(self) -> bool:
        return self.ejected_until is None


def cooldown_for(ejections: int, cooldown_s: float, max_cooldown_s: float) -> float:
    """How long the ``ejections``-th ejection of a member in a row lasts: ``cooldown_s``, doubled each time, capped.

    A replica that refuses as misconfigured (it serves another model) passes its /health, so
    every cooldown ends in its readmission and ``eject_after_failures`` more refusals (each sent
    on to another replica) before it leaves again. Doubling, where Envoy multiplies
    base_ejection_time by the count, reaches the cap of 300 s from 10 s at the 6th ejection (18
    refusals over 5 minutes with eject_after_failures = 3) instead of the 30th (90 over 72
    minutes); a replica ejected once or twice (a restart, a burst of timeouts) is out 10 or 20 s
    under either rule, and its first answer starts it over.
    """
    # The exponent is bounded: a replica refusing for months counts thousands of ejections.
    return min(max_cooldown_s, cooldown_s * 2.0 ** min(ejections - 1, 64))


class OutlierPolicy:
    """The settings of one set (a pool's or a chain's config fields of the same names)."""

    __slots__ = ("cooldown_s", "eject_after_failures", "max_cooldown_s", "max_ejected_share")

    def __init__(
        self, *, eject_after_failures: int, cooldown_s: float, max_cooldown_s: float, max_ejected_share: float
    ) -> None:
        self.eject_after_failures = eject_after_failures
        self.cooldown_s = cooldown_s
        self.max_cooldown_s = max_cooldown_s
        self.max_ejected_share = max_ejected_share


M = TypeVar("M", bound=Member)


class Outliers(Generic[M]):
    """Ejection and readmission of ``members``; log lines are ``{kind}_ejected`` etc., with ``model`` and ``{kind}``."""

    def __init__(
        self,
        members: Sequence[M],
        policy: OutlierPolicy,
        *,
        model: str,
        kind: str,
        logger: Any,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.members = list(members)
        self.policy = policy
        self._model = model
        self._kind = kind
        self._log = logger if logger is not None else structlog.get_logger("adapters.outliers")
        # Cooldowns are measured on this clock (seconds; tests step it instead of sleeping).
        self.clock = clock

    def cooldown(self, ejections: int) -> float:
        return cooldown_for(ejections, self.policy.cooldown_s, self.policy.max_cooldown_s)

    # -- verdicts of calls -------------------------------------------------------------------
    def answered(self, member: M) -> None:
        """A call answered: its run of failures and of ejections ends (its next ejection is ``cooldown_s`` again).

        (A passing probe does not end them: a replica serving another model passes its /health.)
        """
        member.consecutive_failures, member.capped, member.ejections = 0, False, 0

    def failed(self, member: M, reason: str) -> None:
        """A call failed in a way that counts against the member; eject it at ``eject_after_failures``."""
        member.consecutive_failures += 1
        if member.admitted and member.consecutive_failures >= self.policy.eject_after_failures:
            self.eject(member, reason, failures=member.consecutive_failures)

    def eject(self, member: M, reason: str, **fields: Any) -> None:
        """Take an admitted member out of rotation for its cooldown (:func:`cooldown_for`), unless the cap is reached.

        Whole-set trouble (overload: every replica hits read_timeout_s) looks like every member
        failing; ejecting them all would answer 503 for cooldown_s after the load has passed. So
        at most ``max_ejected_share`` of the set is ejected at once (a set of one is never
        ejected by default), and the others keep serving, however slowly. A capped member keeps
        its failure count and is ejected at its next failure once there is room.
        """
        ejected = sum(1 for m in self.members if not m.admitted)
        allowed = int(self.policy.max_ejected_share * len(self.members) + 1e-9)  # 0.3 * 10 is 2.999...
        if ejected >= allowed:
            # Once when the cap starts holding this member back: not at each failed call, nor at
            # each /ready poll (a pool of one whose replica is down would log at every poll).
            if not member.capped:
                member.capped = True
                self._log.warning(
                    f"{self._kind}_ejection_capped",
                    model=self._model,
                    reason=reason,
                    ejected=ejected,
                    max_ejected_share=self.policy.max_ejected_share,
                    **{self._kind: member.shown, f"{self._kind}s": len(self.members)},
                    **fields,
                )
            return
        member.ejections += 1
        cooldown = self.cooldown(member.ejections)
        member.ejected_until, member.capped = self.clock() + cooldown, False
        self._log.warning(
            f"{self._kind}_ejected",
            model=self._model,
            reason=reason,
            cooldown_s=cooldown,
            ejections=member.ejections,
            **{self._kind: member.shown},
            **fields,
        )

    # -- probes ------------------------------------------------------------------------------
    def probed(self, member: M, ok: bool, reason: str) -> None:
        """Apply a probe's verdict: readmit a member whose cooldown is over, eject an admitted one that failed."""
        if ok:
            if member.ejected_until is None:
                # Its failed calls stand (only an answered call ends them): a replica serving
                # another model passes /health, and a reset at each /ready poll would keep it
                # from ever reaching eject_after_failures in a quiet pool. The capped spell ends
                # only if no reason to eject it is left: a failed probe's is gone, a run of
                # failed calls' is not (else each poll would log the cap again).
                if member.consecutive_failures < self.policy.eject_after_failures:
                    member.capped = False
            elif member.ejected_until <= self.clock():
                self._log.info(f"{self._kind}_readmitted", model=self._model, **{self._kind: member.shown})
                member.ejected_until, member.consecutive_failures, member.capped = None, 0, False
            # Else it stays out until its cooldown is over: /ready probes ejected members too, and
            # one ejected as misconfigured passes its /health, so readmitting it at each /ready
            # poll (every 5 s in deploy/k8s) would cut every cooldown short.
        elif member.admitted:
            # Under the same cap as traffic: a /ready poll while every replica is slow to answer
            # its /health (TEI's runs through the busy backend) must not eject the whole pool.
            self.eject(member, f"probe {reason}")
        elif member.ejected_until is not None and member.ejected_until <= self.clock():
            # Still failing when its cooldown is over: another cooldown as long (it is already
            # counted in the cap). Not a longer one: it was not readmitted in between, and once it
            # is up it is readmitted soonest.
            member.ejected_until = self.clock() + self.cooldown(member.ejections)
        # A failed probe during the cooldown leaves its end where it is: restarting it at each
        # poll (every 5 s in deploy/k8s) would keep a member that is up again out for up to a
        # whole cooldown more (300 s at the cap) after its last failed poll.

    async def admitted_of(
        self, candidates: Sequence[M], probe: Callable[[M], Awaitable[Any]], *, wait: bool = True
    ) -> list[M]:
        """The admitted members of ``candidates``, in their order, after probing those whose cooldown is over.

        Each due member gets one probe task (``probe(member)``, which applies its verdict through
        :meth:`probed`), started here and shared by concurrent callers. When no candidate is
        admitted and ``wait``, the due probes are awaited (bounded by the probe's own limit).
        """
        now = self.clock()
        due = [m for m in candidates if m.ejected_until is not None and m.ejected_until <= now]
        for member in due:
            if member.probe is None:
                member.probe = asyncio.create_task(_ignore_result(probe(member)), name=f"probe:{member.shown}")
                member.probe.add_done_callback(_probe_done(member))
        admitted = [m for m in candidates if m.admitted]
        if not admitted and due and wait:
            # Everything left is ejected: wait for the probes.
            await asyncio.gather(*(asyncio.shield(m.probe) for m in due if m.probe is not None), return_exceptions=True)
            admitted = [m for m in candidates if m.admitted]
        return admitted

    def retry_after(self) -> int:
        """Whole seconds until the first ejected member's cooldown ends (at least 1): a 503's Retry-After."""
        now = self.clock()
        waits = [m.ejected_until - now for m in self.members if m.ejected_until is not None]
        return max(1, int(min(waits, default=self.policy.cooldown_s)) + 1)


async def _ignore_result(awaitable: Awaitable[Any]) -> None:
    await awaitable


def _probe_done(member: Member) -> Callable[[asyncio.Task[None]], None]:
    def done(_task: asyncio.Task[None]) -> None:
        member.probe = None

    return done
