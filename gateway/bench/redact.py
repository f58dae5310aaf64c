"""Keep credentials out of everything ``bench`` writes: stdout, stderr, ``bench.json``, ``report.md``.

Benchmark reports get shared, and the command line that produced them is part of the report, so
the secrets it carries (``--api-key``, ``--compare-api-key``, ``--header`` values, a password or
token in an endpoint URL) are replaced by :data:`REDACTED`, the way the gateway itself names a key
only by its id in logs and metrics. Two layers, because either alone misses cases:

- the command line is redacted argument by argument (an argument equal to a secret, the value
  half of ``--flag=secret``, every ``--header`` value, a URL's password and key-like query
  values), which works for secrets of any length and any abbreviation argparse accepted;
- every string written or printed is then scrubbed of each secret's occurrences, which catches a
  key that reaches an output some other way (an error message quoting a URL, a server echoing a
  header). Secrets shorter than :data:`_MIN_SCRUB` are left to the first layer: replacing "1"
  everywhere would wreck the report without protecting anything.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

__all__ = ("REDACTED", "Redactor")

REDACTED = "<redacted>"
_MIN_SCRUB = 4
# Header and query-parameter names whose values are credentials (Authorization, X-API-Key,
# api-key (Azure), x-goog-api-key, Cookie, access_token, sig, ...).
_SECRET_NAME = re.compile(r"auth|key|token|secret|passw|cookie|sig|session|credential", re.IGNORECASE)


def _url_secrets(url: str) -> list[str]:
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return []
    found = [password] if password else []
    if parts.username and password is None:
        found.append(parts.username)  # https://TOKEN@host: the token is the user name
    found += [v for k, v in parse_qsl(parts.query, keep_blank_values=False) if _SECRET_NAME.search(k)]
    return found


def _header_value(item: str) -> tuple[str, str] | None:
    name, sep, value = item.partition(":")
    return (name.strip(), value.strip()) if sep else None


class Redactor:
    """The secrets of one ``bench`` invocation and the means to keep them out of its outputs."""

    def __init__(self, *, keys: Iterable[str | None], headers: Iterable[str], urls: Iterable[str | None]) -> None:
        found = [k for k in keys if k]
        for item in headers:
            nv = _header_value(item)
            if nv and nv[1]:
                found.append(nv[1])
                # "Bearer rk-..." is also matched without its scheme.
                scheme, _, token = nv[1].partition(" ")
                if token.strip() and scheme.lower() in ("bearer", "basic", "token"):
                    found.append(token.strip())
        for url in urls:
            if url:
                found += _url_secrets(url)
        # Longest first, so a secret containing another is replaced whole.
        self.secrets = sorted({s for s in found if s}, key=len, reverse=True)

    def scrub(self, text: str) -> str:
        for secret in self.secrets:
            if len(secret) >= _MIN_SCRUB:
                text = text.replace(secret, REDACTED)
        # Error texts are cut to a length (the driver keeps a body's first 120 characters): a
        # secret cut there leaves its start at the end of the text.
        for secret in self.secrets:
            for n in range(min(len(secret) - 1, len(text)), _MIN_SCRUB - 1, -1):
                if text.endswith(secret[:n]):
                    return text[: len(text) - n] + REDACTED
        return text

    def scrub_tree(self, value: Any) -> Any:
        """A copy of a JSON-like tree with every string (keys included) scrubbed."""
        if isinstance(value, str):
            return self.scrub(value)
        if isinstance(value, dict):
            return {self.scrub_tree(k): self.scrub_tree(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.scrub_tree(v) for v in value]
        return value

    def url(self, url: str) -> str:
        """``url`` without its user info and with key-like query values redacted (for labels)."""
        try:
            parts = urlsplit(url)
        except ValueError:
            return self.scrub(url)
        netloc = parts.netloc.rpartition("@")[2]
        query = parts.query
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(_SECRET_NAME.search(k) for k, _ in pairs):
            query = "&".join(f"{k}={REDACTED if _SECRET_NAME.search(k) else v}" for k, v in pairs)
        return self.scrub(urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment)))

    def argv(self, argv: Sequence[str]) -> list[str]:
        out: list[str] = []
        header_next = False
        for arg in argv:
            if header_next:
                nv = _header_value(arg)
                arg = f"{nv[0]}: {REDACTED}" if nv else REDACTED
                header_next = False
            elif arg in self.secrets:
                arg = REDACTED
            elif arg.startswith("--") and "=" in arg:
                flag, _, value = arg.partition("=")
                if value in self.secrets or "--header".startswith(flag):
                    nv = _header_value(value)
                    arg = f"{flag}={nv[0]}: {REDACTED}" if nv and "--header".startswith(flag) else f"{flag}={REDACTED}"
            elif len(arg) > 4 and "--header".startswith(arg):  # --header, --head, --hea: argparse's abbreviations
                header_next = True
            if "://" in arg:
                arg = self.url(arg)
            out.append(self.scrub(arg))
        return out

    def command(self, argv: Sequence[str]) -> str:
        return "rerank-gateway bench " + shlex.join(self.argv(argv))
