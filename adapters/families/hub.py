"""Can the Hugging Face hub be asked at all? One quick probe, before any download.

huggingface_hub retries a failed connection five times with back-off (1+2+4+8+8 s), so a model
whose files are not cached took 23-26 s per load attempt to fail on a machine without the hub,
although its DNS lookup failed at once, and the error then said only that "the hub is
unreachable" even where HF_HUB_OFFLINE had forbidden asking it. This module asks the network
once (DNS, then a TCP connection, a few seconds at most) and names the cause in words:
offline mode, a name that does not resolve, a host that refuses or drops connections. An answer
over HTTP (a 5xx, a proxy's 403) is not judged here: the download reports it (``http_failure``).
"""

from __future__ import annotations

import os
import socket
from urllib.parse import urlsplit

__all__ = ("HubUnreachableError", "http_failure", "offline_mode", "unreachable_reason")

_TRUE = ("1", "on", "yes", "true")
# A TCP connect that neither succeeds nor fails in this time counts as dropped packets.
CONNECT_TIMEOUT_S = 3.0


class HubUnreachableError(FileNotFoundError):
    """The hub could not be asked for a file the local cache does not hold; ``reason`` says why."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def offline_mode() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set: the hub must not be asked."""
    return any(os.environ.get(name, "").strip().lower() in _TRUE for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _endpoint() -> str:
    """The URL the hub client will ask: its own constant (HF_ENDPOINT as read at its import)."""
    try:
        from huggingface_hub import constants
    except ImportError:
        return os.environ.get("HF_ENDPOINT", "").strip() or "https://huggingface.co"
    return str(constants.ENDPOINT)


def _proxied(scheme: str) -> bool:
    return any(
        os.environ.get(name) for name in (f"{scheme}_proxy", f"{scheme.upper()}_PROXY", "all_proxy", "ALL_PROXY")
    )


def unreachable_reason(timeout: float = CONNECT_TIMEOUT_S) -> str | None:
    """Why the hub cannot be asked, as a phrase ("HF_HUB_OFFLINE is set, ..."), or None if it can.

    Behind a proxy the hub's host is the proxy's business: no probe (None), the client tries.
    """
    if offline_mode():
        return "HF_HUB_OFFLINE is set, so nothing is downloaded"
    parts = urlsplit(_endpoint())
    host = parts.hostname or ""
    port = parts.port or (80 if parts.scheme == "http" else 443)
    if not host or _proxied(parts.scheme or "https"):
        return None
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        return f"the hub's name {host} does not resolve (DNS: {exc.strerror or exc}): no network, or no DNS for it"
    last: OSError | None = None
    for family, kind, proto, _, address in addresses[:4]:
        try:
            with socket.socket(family, kind, proto) as sock:
                sock.settimeout(timeout)
                sock.connect(address)
            return None
        except OSError as exc:
            last = exc
    detail = "timed out" if isinstance(last, TimeoutError) else (getattr(last, "strerror", None) or str(last))
    return f"the hub {host}:{port} resolves but takes no connection ({detail}): a firewall, or no route out"


def http_failure(exc: BaseException) -> str | None:
    """ "the hub answered HTTP 503" where a download failed on an HTTP answer, else None."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        response = getattr(current, "response", None)
        status = getattr(response, "status_code", None)
        if isinstance(status, int):
            return f"the hub answered HTTP {status}"
        current = current.__cause__ or current.__context__
    return None
