"""What a pool knows about each of its replicas, how long an ejection lasts, and which replica a key prefers.

Apart from :mod:`adapters.upstreams.pool` (the calls, failover and health) because these are its
plain data and arithmetic: no I/O, testable alone.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any
from urllib.parse import urlsplit, urlunsplit

__all__ = ("Replica", "cooldown_for", "redact_url", "rendezvous_order")


class Replica:
    """One upstream URL and what the pool knows about it."""

    __slots__ = (
        "capped", "consecutive_failures", "ejected_until", "ejections", "outstanding", "probe", "served", "shown",
        "url",
    )

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        # What logs, error messages and /ready (open without a key) say instead of url: once
        # here, not on each call.
        self.shown = redact_url(self.url)
        self.outstanding = 0
        self.served = 0
        self.consecutive_failures = 0
        # True while the ejection cap keeps this failing replica in rotation: the cap is logged
        # when this turns True, not at each failed call or /ready probe while it stays so.
        self.capped = False
        # None while admitted; the time its cooldown ends (on the pool's clock) while ejected.
        self.ejected_until: float | None = None
        # Ejections since its last answered call: the next one lasts cooldown_for(ejections + 1).
        self.ejections = 0
        self.probe: asyncio.Task[None] | None = None

    @property
    def admitted(self) -> bool:
        return self.ejected_until is None

    def stats(self) -> dict[str, Any]:
        return {
            "url": self.shown,
            "admitted": self.admitted,
            "outstanding": self.outstanding,
            "served": self.served,
            "consecutive_failures": self.consecutive_failures,
            "ejections": self.ejections,
        }


def redact_url(url: str) -> str:
    """``url`` with its userinfo (``user:password@``) as ``***@`` and no query string or fragment.

    The config takes any URL, and credentials or a token in one must not reach the log lines or
    ``/ready``, which needs no key.
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return "(a URL that does not parse)"
    if "@" not in parts.netloc and "@" in parts.path + parts.query + parts.fragment:
        # Most likely a password holding an unencoded '/', '?' or '#', which ends the host part
        # early: what urlsplit calls the host and port would be the user name and part of it.
        return "(URL not shown: it may hold credentials)"
    host = parts.netloc.rpartition("@")[2]  # the last '@': a password may hold another
    netloc = f"***@{host}" if "@" in parts.netloc else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def cooldown_for(ejections: int, cooldown_s: float, max_cooldown_s: float) -> float:
    """How long the ``ejections``-th ejection of a replica in a row lasts: ``cooldown_s``, doubled each time, capped.

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


def rendezvous_order(key: bytes, replicas: list[Replica]) -> list[Replica]:
    """Replicas by descending hash weight of (key, url): stable per key, minimal movement."""

    def weight(replica: Replica) -> bytes:
        return hashlib.blake2b(key + replica.url.encode(), digest_size=8).digest()

    return sorted(replicas, key=weight, reverse=True)
