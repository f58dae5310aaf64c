"""A minimal Cohere-compatible rerank server: the zero-work upstream of the suites' proxies.

Raw ASGI on uvicorn: it decodes the JSON body (msgspec), gives every document the same score and
answers in Cohere's v2 shape, the least any HTTP rerank server must do; in front of it, the
proxies' own cost is the only difference. ``--delay-s``: a slow one.

    python -m benchmarks.stub_upstream --port 9100
"""

from __future__ import annotations

import argparse
import asyncio
import uuid
from typing import Any

import msgspec

__all__ = ("app", "read_body", "serve_lifespan")


class _Request(msgspec.Struct):
    documents: list[Any]
    query: Any = None
    top_n: int | None = None


_decode = msgspec.json.Decoder(_Request).decode
_encode = msgspec.json.Encoder().encode
_HEADERS = [(b"content-type", b"application/json")]
_HEALTH = b'{"status":"ok"}'


async def read_body(receive: Any) -> bytes:
    """The whole request body, however many ASGI messages it came in."""
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def serve_lifespan(receive: Any, send: Any) -> None:
    """ASGI's lifespan protocol for an app with nothing to start or stop: until the shutdown."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await serve_lifespan(receive, send)
        return
    if scope["type"] != "http":
        return
    path, method = scope["path"], scope["method"]
    if method == "POST" and path.endswith("rerank"):
        try:
            req = _decode(await read_body(receive))
        except msgspec.DecodeError as exc:
            status, body = 400, _encode({"message": f"invalid request: {exc}"})
        else:
            n = len(req.documents)
            top = min(req.top_n or n, n)
            status = 200
            body = _encode(
                {
                    "id": str(uuid.uuid4()),
                    "results": [{"index": i, "relevance_score": 0.5} for i in range(top)],
                    "meta": {
                        "api_version": {"version": "2"},
                        "billed_units": {"search_units": 1},
                        "tokens": {"input_tokens": n},
                    },
                }
            )
    elif method == "GET" and path in ("/health", "/ready", "/"):
        status, body = 200, _HEALTH
    else:
        status, body = 404, b'{"message":"not found"}'
    await send({"type": "http.response.start", "status": status, "headers": _HEADERS})
    await send({"type": "http.response.body", "body": body})


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9100)
    # A benchmark that pauses a gateway (SIGSTOP) for longer than uvicorn's 5 s default finds its
    # pooled connections closed by the stub in the meantime: the first requests after SIGCONT then
    # race the close and fail (503), which is not what it measures.
    parser.add_argument("--keep-alive-s", type=float, default=5.0)
    parser.add_argument(
        "--delay-s", type=float, default=0.0, help="a slow upstream: this long before each rerank answer"
    )
    args = parser.parse_args()

    async def slow(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].endswith("rerank"):
            await asyncio.sleep(args.delay_s)
        await app(scope, receive, send)

    uvicorn.run(
        slow if args.delay_s else app,
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        timeout_keep_alive=args.keep_alive_s,
    )


if __name__ == "__main__":
    main()
