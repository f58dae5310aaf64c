"""Hostile HTTP requests, written as raw bytes, and a raw-socket client to send them.

Used by tests/test_reliability.py (fast, in CI) and ``python -m benchmarks.reliability`` (the
long run). Every case is what a careless or malicious client can put on the wire: deep nesting,
huge strings and numbers, NaN/Infinity, invalid UTF-8, lone surrogates, a BOM, duplicate keys,
wrong content types and encodings, trailing garbage, too many documents, oversize and chunked
bodies, half-sent bodies and hang-ups. The gateway must answer each with a 4xx carrying the JSON
error body (or a 2xx where the input is odd but valid), never a 5xx, and keep serving.

Bytes go over a plain socket (not an HTTP library) so the framing itself can be wrong.
"""

from __future__ import annotations

import gzip
import json
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ("Case", "RawResponse", "hostile_cases", "hostile_pass", "send_raw")

# What a case may get back: "error" = a 4xx with the JSON error body; "ok" = 2xx;
# "ok_or_error" = either; "parser_400" = the ASGI server's own text/plain 400 (unparseable HTTP);
# "no_answer" = the client hangs up, nothing to read.
Expect = str


@dataclass(frozen=True)
class Case:
    name: str
    head: bytes  # request line + headers, without the blank line
    body: bytes = b""
    expect: Expect = "error"
    statuses: tuple[int, ...] = ()  # when set, the status must be one of these
    send_whole: bool = True  # False: send `partial` bytes of the body, then act (see hang_up)
    partial: int = 0
    hang_up: bool = False  # after a partial body: close at once (else wait for the server)
    raw: bytes | None = None  # the exact bytes to send instead of head + body


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    elapsed_s: float = 0.0

    def json(self) -> object:
        return json.loads(self.body)


def _request(
    path: str, body: bytes, *, key: str | None, content_type: str = "application/json", extra: str = ""
) -> bytes:
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    return (
        f"POST {path} HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n{auth}"
        f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n{extra}"
    ).encode()


def _chunked_head(path: str, *, key: str | None) -> bytes:
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    return (
        f"POST {path} HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n{auth}"
        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
    ).encode()


def _chunked(body: bytes, size: int = 1000) -> bytes:
    parts = [b"%x\r\n%s\r\n" % (len(body[i : i + size]), body[i : i + size]) for i in range(0, len(body), size)]
    return b"".join(parts) + b"0\r\n\r\n"


def hostile_cases(model: str, *, key: str | None, max_body_bytes: int, max_documents: int) -> Iterator[Case]:
    """Every hostile request, for a gateway serving ``model`` with these limits."""

    def body(**fields: object) -> bytes:
        return json.dumps({"model": model, "query": "q", "documents": ["a", "b"], **fields}).encode()

    def post(name: str, raw_body: bytes, expect: Expect = "error", path: str = "/v2/rerank", **kw: object) -> Case:
        ct = str(kw.pop("content_type", "application/json"))
        extra = str(kw.pop("extra", ""))
        return Case(name, _request(path, raw_body, key=key, content_type=ct, extra=extra), raw_body, expect, **kw)  # type: ignore[arg-type]

    valid = body()
    deep = b"[" * 100_000 + b"]" * 100_000
    # -- nesting ------------------------------------------------------------------------------
    yield post("nested-body", deep, statuses=(400,))
    yield post("nested-unclosed", b"[" * 500_000, statuses=(400,))
    yield post("nested-objects", b'{"a":' * 50_000 + b"1" + b"}" * 50_000, statuses=(400,))
    yield post("nested-document", valid.replace(b'"a"', b'{"text":"a","m":' + deep + b"}"), statuses=(400,))
    yield post("nested-query", valid.replace(b'"q"', deep), statuses=(400,))
    yield post("nested-rank-fields", body(rank_fields=None).replace(b"null", deep), statuses=(400,))
    for path in ("/v1/rerank", "/rerank", "/v1/v1/rerank", "/v1/v2/rerank"):
        yield post(f"nested-on-{path}", deep, path=path, statuses=(400,))
    # -- sizes ----------------------------------------------------------------------------------
    half = max_body_bytes // 2
    yield post("huge-document", body(documents=["x" * half]), "ok")
    yield post("huge-query", body(query="q" * (half // 2)), "ok")
    yield post("huge-instruction", body(instruction="i " * (half // 4)), "ok")
    yield post("many-small-documents", body(documents=["d"] * max_documents), "ok")
    yield post("too-many-documents", body(documents=["d"] * (max_documents + 1)), statuses=(413,))
    yield post("oversize-body", b'{"query":"' + b"x" * (max_body_bytes + 10) + b'"}', statuses=(413,))
    yield Case(
        "oversize-announced",
        _request("/v2/rerank", b"", key=key).replace(
            b"Content-Length: 0", b"Content-Length: %d" % (max_body_bytes * 4)
        ),
        b"{",
        "error",
        statuses=(413,),
        send_whole=False,
        partial=1,
    )
    yield post("huge-integer", body(top_n=None).replace(b"null", b"9" * 5000), statuses=(422,))
    yield post("huge-float", body(top_n=None).replace(b"null", b"1e400"), statuses=(400, 422))
    yield post(
        "huge-number-in-document",
        body(documents=[{"text": "a", "n": 0}]).replace(b'"n": 0', b'"n": 1e999'),
        statuses=(422, 400),
    )
    yield post("negative-top-n", body(top_n=-1), statuses=(422,))
    yield post("int64-overflow", body(max_tokens_per_doc=2**63), statuses=(422,))
    # -- literals and encodings ---------------------------------------------------------------
    for literal in (b"NaN", b"Infinity", b"-Infinity", b"nan", b"undefined"):
        yield post(f"literal-{literal.decode()}", body(top_n=None).replace(b"null", literal), statuses=(400,))
    yield post("invalid-utf8", valid.replace(b'"a"', b'"\xff\xfe\xfa"'), statuses=(400,))
    yield post("overlong-utf8", valid.replace(b'"a"', b'"\xc0\xaf"'), statuses=(400,))
    yield post("raw-surrogate-utf8", valid.replace(b'"a"', b'"\xed\xa0\x80"'), statuses=(400,))
    yield post("lone-high-surrogate", valid.replace(b'"a"', b'"\\ud800"'), statuses=(400,))
    yield post("lone-low-surrogate", valid.replace(b'"q"', b'"\\udfff x"'), statuses=(400,))
    yield post("surrogate-pair-ok", valid.replace(b'"a"', b'"\\ud83d\\ude00"'), "ok")
    yield post("nul-and-controls", valid.replace(b'"a"', b'"\\u0000\\u0001\\u001f"'), "ok")
    yield post("bom", b"\xef\xbb\xbf" + valid, statuses=(400,))
    yield post(
        "utf16", valid.decode().encode("utf-16"), statuses=(400,), content_type="application/json; charset=utf-16"
    )
    yield post("latin1-charset", valid, "ok", content_type="application/json; charset=latin-1")
    yield post("gzip-encoded", gzip.compress(valid), statuses=(400,), extra="Content-Encoding: gzip\r\n")
    # -- shapes ---------------------------------------------------------------------------------
    yield post("duplicate-keys", valid[:-1] + b', "query": "again", "documents": ["c"]}', "ok")
    yield post("trailing-garbage", valid + b"}}garbage", statuses=(400,))
    yield post("two-documents", valid + valid, statuses=(400,))
    yield post("empty", b"", statuses=(400,))
    yield post("whitespace", b" \r\n\t ", statuses=(400,))
    for top in (b"[]", b'"x"', b"null", b"1", b"true"):
        yield post(f"top-level-{top.decode()}", top, statuses=(422,))
    yield post("query-object-empty", body(query={}), statuses=(422,))
    yield post("query-whitespace", body(query=" \n\t "), statuses=(422,))
    yield post("documents-empty", body(documents=[]), statuses=(422,))
    yield post("documents-null", body(documents=None), statuses=(422,))
    yield post("document-image", body(documents=[{"image": "data:..."}]), statuses=(422,))
    yield post("string-top-n", body(top_n="2"), statuses=(422,))
    yield post("float-top-n", body(top_n=1.5), statuses=(422,))  # 1.0 is an integer (JSON Schema), 1.5 is not
    yield post("string-bool", body(return_documents="true"), statuses=(422,))
    yield post("model-number", body(model=7), statuses=(422,))
    yield post("model-unknown", body(model="x" * 256), statuses=(404,))
    # Longer than any configured name can be: refused unread, never echoed (schemas.rerank).
    yield post("model-too-long", body(model="x" * 10_000), statuses=(422,))
    yield post("unicode-soup", body(query="👩‍👩‍👧 \u202e\u0301 ÿ", documents=["\U0010ffff", "日本語"]), "ok")
    # -- content types: the body is read as JSON whatever the header says --------------------
    yield post("text-plain", valid, "ok", content_type="text/plain")
    yield post(
        "form-urlencoded", b"query=q&documents=a", statuses=(400,), content_type="application/x-www-form-urlencoded"
    )
    yield post(
        "multipart",
        b"--b\r\nContent-Disposition: form-data; name=q\r\n\r\nq\r\n--b--\r\n",
        statuses=(400,),
        content_type="multipart/form-data; boundary=b",
    )
    yield post("msgpack", b"\x82\xa5query\xa1q", statuses=(400,), content_type="application/msgpack")
    # -- framing --------------------------------------------------------------------------------
    yield Case("chunked-valid", _chunked_head("/v2/rerank", key=key), _chunked(valid, 7), "ok")
    yield Case(
        "chunked-oversize",
        _chunked_head("/v2/rerank", key=key),
        _chunked(b'{"query":"' + b"x" * (max_body_bytes + 10) + b'"}', 65536),
        statuses=(413,),
    )
    yield Case("chunked-bad-size", _chunked_head("/v2/rerank", key=key), b"zz\r\n{}\r\n0\r\n\r\n", "parser_400")
    yield Case(
        "chunked-truncated",
        _chunked_head("/v2/rerank", key=key),
        b'ff\r\n{"q',
        "no_answer",
        send_whole=False,
        partial=6,
        hang_up=True,
    )
    yield Case(
        "half-body-hang-up",
        _request("/v2/rerank", valid, key=key),
        valid,
        "no_answer",
        send_whole=False,
        partial=10,
        hang_up=True,
    )
    yield Case(
        "half-body-wait",
        _request("/v2/rerank", valid, key=key),
        valid,
        "error",
        statuses=(408,),
        send_whole=False,
        partial=10,
    )
    yield Case("content-length-short", _request("/v2/rerank", valid[:-5], key=key), valid, statuses=(400,))
    yield Case(
        "no-content-length",
        _request("/v2/rerank", b"", key=key).replace(b"Content-Length: 0\r\n", b""),
        b"",
        statuses=(400,),
    )
    yield Case(
        "garbage-request-line",
        b"",
        raw=b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64,
        expect="parser_400",
    )
    yield Case("bad-header", b"", raw=b"POST /v2/rerank HTTP/1.1\r\nHost: g\r\nBad Header\r\n\r\n", expect="parser_400")
    # -- routes and methods ---------------------------------------------------------------------
    yield Case("get-on-rerank", b"GET /v2/rerank HTTP/1.1\r\nHost: g\r\nConnection: close\r\n", statuses=(405,))
    yield Case(
        "put-on-rerank", _request("/v2/rerank", valid, key=key).replace(b"POST", b"PUT", 1), valid, statuses=(405,)
    )
    yield Case("unknown-route", _request("/v3/rerank", valid, key=key), valid, statuses=(404,))
    yield Case("path-traversal", b"GET /../../etc/passwd HTTP/1.1\r\nHost: g\r\nConnection: close\r\n", statuses=(404,))
    yield Case(
        "long-url", b"GET /" + b"a" * 60_000 + b" HTTP/1.1\r\nHost: g\r\nConnection: close\r\n", expect="any_non_5xx"
    )
    yield Case(
        "bad-request-id", _request("/v2/rerank", valid, key=key, extra="X-Request-Id: <script>\r\n"), valid, "ok"
    )
    if key:
        yield Case("no-key", _request("/v2/rerank", valid, key=None), valid, statuses=(401,))
        yield Case("wrong-key", _request("/v2/rerank", valid, key="rk-" + "0" * 40), valid, statuses=(401,))
        yield Case("garbage-key", _request("/v2/rerank", valid, key="\xff x"), valid, statuses=(401,))


def _read_response(sock: socket.socket) -> RawResponse | None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return None if not data else RawResponse(status=-1, body=data)
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    while True:  # Connection: close on every case, so read to the end
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, TimeoutError):
            break
        if not chunk:
            break
        rest += chunk
    if headers.get("transfer-encoding") == "chunked":
        out, buf = b"", rest
        while buf:
            size_line, _, buf = buf.partition(b"\r\n")
            size = int(size_line.split(b";")[0] or b"0", 16)
            if size == 0:
                break
            out, buf = out + buf[:size], buf[size + 2 :]
        rest = out
    return RawResponse(status=status, headers=headers, body=rest)


def send_raw(host: str, port: int, case: Case, *, timeout: float = 30.0) -> RawResponse | None:
    """Send one case on a fresh connection; the response, or None when there is none to read."""
    start = time.monotonic()
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.settimeout(timeout)
        try:
            if case.raw is not None:
                sock.sendall(case.raw)
            elif case.send_whole:
                sock.sendall(case.head + b"\r\n" + case.body)
            else:
                sock.sendall(case.head + b"\r\n" + case.body[: case.partial])
                if case.hang_up:
                    time.sleep(0.2)
                    sock.shutdown(socket.SHUT_RDWR)
                    return None
            response = _read_response(sock)
        except (BrokenPipeError, ConnectionResetError):
            # The server may answer (413) and close before the whole body is sent.
            try:
                response = _read_response(sock)
            except OSError:
                response = None
    if response is not None:
        response.elapsed_s = time.monotonic() - start
    return response


def hostile_pass(port: int, *, key: str, max_body_bytes: int, max_documents: int, timeout: float) -> dict[str, Any]:
    """Every case once against the gateway on ``port`` (model ``static``): how many, the 5xx, the
    4xx without the JSON error body, and what failed (a connection error is a failure, not a 5xx)."""
    tried = five = bad_body = 0
    failures: list[str] = []
    for case in hostile_cases("static", key=key, max_body_bytes=max_body_bytes, max_documents=max_documents):
        tried += 1
        try:
            resp = send_raw("127.0.0.1", port, case, timeout=timeout)
        except OSError as exc:
            failures.append(f"{case.name}: {type(exc).__name__}")
            continue
        if resp is None:
            continue
        if resp.status >= 500:
            five += 1
            failures.append(f"{case.name}: {resp.status}")
        elif resp.status >= 400 and case.expect not in ("parser_400", "any_non_5xx"):
            try:
                ok = set(resp.json()) == {"message", "id", "detail"}  # type: ignore[arg-type]
            except ValueError:
                ok = False
            if not ok:
                bad_body += 1
                failures.append(f"{case.name}: {resp.status} without the JSON error body")
    return {"tried": tried, "five_xx": five, "four_xx_without_json_body": bad_body, "failures": failures}
