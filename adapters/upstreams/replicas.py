"""What a pool knows about each of its replicas and which replica a key prefers (ejection: :mod:`adapters.outliers`).

Apart from :mod:`adapters.upstreams.pool` (the calls, failover and health) because these are its
plain data and arithmetic: no I/O, testable alone.
"""

from __future__ import annotations

import hashlib
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from adapters.outliers import Member, cooldown_for

__all__ = ("Replica", "cooldown_for", "redact_url", "rendezvous_order")  # cooldown_for: from adapters.outliers


class Replica(Member):
    """One upstream URL and what the pool knows about it (its health: :class:`adapters.outliers.Member`)."""

    __slots__ = ("outstanding", "served", "url")

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        # What logs, error messages and /ready (open without a key) say instead of url: once
        # here, not on each call.
        super().__init__(redact_url(self.url))
        self.outstanding = 0
        self.served = 0

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


def rendezvous_order(key: bytes, replicas: list[Replica]) -> list[Replica]:
    """Replicas by descending hash weight of (key, url): stable per key, minimal movement."""

    def weight(replica: Replica) -> bytes:
        return hashlib.blake2b(key + replica.url.encode(), digest_size=8).digest()

    return sorted(replicas, key=weight, reverse=True)
