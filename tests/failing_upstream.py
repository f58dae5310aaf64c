"""A Cohere-shaped rerank server on loopback that fails some requests on purpose: the bench's
failure accounting is tested against real failures (an HTTP error and a request never answered).

Requests are numbered as they arrive (0, 1, 2, ...): number ``k`` with ``k % 6 == 1`` gets a 502,
``k % 6 == 4`` is never answered (the handler waits until the client hangs up), every other one
gets a well-formed answer. The counts per run are therefore fixed whatever the concurrency.

    python -m tests.failing_upstream --port 9101
"""

from __future__ import annotations

import argparse
import itertools
from typing import Any

import msgspec

from benchmarks.stub_upstream import read_body, serve_lifespan

__all__ = ("app", "outcome")


class _Request(msgspec.Struct):
    documents: list[Any]
    top_n: int | None = None


_decode = msgspec.json.Decoder(_Request).decode
_encode = msgspec.json.Encoder().encode
_HEADERS = [(b"content-type", b"application/json")]
_arrivals = itertools.count()


def outcome(k: int) -> str:
    """What request number ``k`` gets: "502", "hang" or "ok"."""
    return {1: "502", 4: "hang"}.get(k % 6, "ok")


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await serve_lifespan(receive, send)
        return
    if scope["type"] != "http":
        return
    if scope["method"] == "GET":
        status, body = 200, b'{"status":"ok"}'
    else:
        req = _decode(await read_body(receive))
        what = outcome(next(_arrivals))
        if what == "hang":
            while (await receive())["type"] != "http.disconnect":  # until the client gives up
                pass
            return
        if what == "502":
            status, body = 502, b'{"message":"upstream failed on purpose"}'
        else:
            n = len(req.documents)
            status = 200
            body = _encode(
                {
                    "id": "x",
                    "results": [{"index": i, "relevance_score": 0.5} for i in range(min(req.top_n or n, n))],
                    "meta": {"api_version": {"version": "2"}},
                }
            )
    await send({"type": "http.response.start", "status": status, "headers": _HEADERS})
    await send({"type": "http.response.body", "body": body})


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
