"""The direct routes (``gateway.http.direct``) answer exactly as Litestar's router does.

Two apps are built from the same settings. Every request goes to the first on its exact path
(served directly) and to the second with a trailing slash, which only Litestar's router
serves (it normalizes the path to the same route). Same request id, same order, so the bodies
must be byte-identical and the headers identical except the values of the timing headers;
at the end both apps' ``/metrics`` must agree too, timing histograms aside.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from litestar import Litestar, Request, Response, get, post
from litestar.background_tasks import BackgroundTask
from litestar.config.cors import CORSConfig
from litestar.di import NamedDependency, Provide
from litestar.logging.config import LoggingConfig
from litestar.params import FromPath, JSONBody
from litestar.testing import TestClient
from structlog.testing import capture_logs

from gateway.app import create_app
from gateway.http.decoding import StrictBody
from gateway.http.direct import DirectRoutes
from gateway.security.auth import generate_key, hash_key
from schemas.config import ApiKeyConfig, AuthConfig, LimitsConfig, Settings, StaticEngineConfig

# Values that are measured, not computed: present on both sides, compared by name only.
TIMED = re.compile(r"^x-(process|tokenize|inference)-time-ms$|reset|^retry-after$")
MAX_BODY = 4096
KEY = generate_key()


class _Spy:
    """Records, per request, whether the app's direct table served it."""

    def __init__(self, direct: Any) -> None:
        self.direct = direct
        self.served: list[tuple[str, bool]] = []

    def match(self, scope: Any) -> Any:
        route = self.direct.match(scope)
        self.served.append((scope["path"], route is not None))
        return route


def _pair(settings: Settings) -> Iterator[tuple[TestClient, TestClient, _Spy, _Spy]]:
    apps = [create_app(settings, configure_logs=False) for _ in range(2)]
    spies = [_Spy(app.direct) for app in apps]
    for app, spy in zip(apps, spies):
        app.direct = spy
    with TestClient(apps[0]) as direct, TestClient(apps[1]) as routed:
        yield direct, routed, spies[0], spies[1]


@pytest.fixture(scope="module")
def open_pair():
    limits = LimitsConfig(max_documents=4, max_body_bytes=MAX_BODY)
    yield from _pair(Settings(models=(StaticEngineConfig(name="static"),), limits=limits))


@pytest.fixture(scope="module")
def keyed_pair():
    key = ApiKeyConfig(id="k", hash=hash_key(KEY), models=("static",), rpm=3, tpm=1000)
    yield from _pair(Settings(models=(StaticEngineConfig(name="static"),), auth=AuthConfig(keys=(key,))))


def _json(value: Any) -> bytes:
    return json.dumps(value).encode()


V1 = {"model": "static", "query": "q", "documents": ["a b", "c", "a b"], "top_n": 2, "return_documents": True}
V2 = {"model": "static", "query": "q", "documents": [{"text": "a"}, "bb"], "max_tokens_per_doc": 8}

OPEN_CASES: list[tuple[str, bytes]] = [
    # answers
    ("/v2/rerank", _json(V2)),
    ("/v1/rerank", _json(V1)),
    ("/rerank", _json(V1)),
    ("/v1/v1/rerank", _json(V1)),
    ("/v1/v2/rerank", _json(V2)),
    ("/rerank", _json({"query": "q", "texts": ["a", "b c"], "return_text": True})),  # TEI
    ("/score", _json({"model": "static", "text_1": "q", "text_2": ["a", "b"]})),  # vLLM
    ("/v1/score", _json({"queries": ["q", "r"], "documents": ["a", "b"]})),
    # errors, in each route's dialect
    ("/v2/rerank", b'{"model": "static", "query":'),  # not JSON: 400
    ("/v1/rerank", b""),  # empty: 400
    ("/score", b"   "),
    ("/v2/rerank", b"[" * 100 + b"]" * 100),  # too deep: 400
    ("/v2/rerank", _json({**V2, "top_n": "2"})),  # wrong type: 422
    ("/v2/rerank", _json({k: v for k, v in V2.items() if k != "model"})),  # v2 needs a model: 422
    ("/v1/rerank", _json({**V1, "model": "nope"})),  # unknown model: 404
    ("/v1/rerank", _json({**V1, "documents": list("abcde")})),  # over max_documents: 413
    ("/v2/rerank", _json({**V2, "documents": ["x" * MAX_BODY]})),  # over max_body_bytes: 413
    ("/rerank", _json({"query": "q", "texts": []})),  # TEI's 400 Empty
    ("/rerank", _json({"query": "q", "texts": ["a"], "raw_scores": True})),  # TEI raw scores
    ("/score", _json({"model": "static"})),  # vLLM: no sides
    ("/v1/score", _json({"model": "nope", "text_1": "q", "text_2": "a"})),
]


def _exchange(
    client: TestClient, path: str, body: bytes, rid: str, headers: dict[str, str]
) -> tuple[int, bytes, dict[str, str]]:
    resp = client.post(path, content=body, headers={"content-type": "application/json", "x-request-id": rid, **headers})
    return resp.status_code, resp.content, dict(resp.headers)


# vLLM's /score answer carries "created" in whole seconds: the two servers' answers, a few ms
# apart, may straddle a second (CI saw 1796297777 vs ...78). Compared apart, within one second.
CREATED = re.compile(rb'"created":(\d+)')


def _same(a: tuple[int, bytes, dict[str, str]], b: tuple[int, bytes, dict[str, str]], case: str) -> None:
    (status_a, body_a, headers_a), (status_b, body_b, headers_b) = a, b
    created_a, created_b = CREATED.findall(body_a), CREATED.findall(body_b)
    assert len(created_a) == len(created_b), case
    assert all(abs(int(x) - int(y)) <= 1 for x, y in zip(created_a, created_b, strict=True)), case
    body_a, body_b = CREATED.sub(b'"created":0', body_a), CREATED.sub(b'"created":0', body_b)
    assert (status_a, body_a) == (status_b, body_b), case
    assert list(headers_a) == list(headers_b), case  # same names, same order
    timed = {name for name in headers_a if TIMED.search(name)}
    assert {k: v for k, v in headers_a.items() if k not in timed} == {
        k: v for k, v in headers_b.items() if k not in timed
    }, case


def _metrics(client: TestClient) -> list[str]:
    """The scrape without timing histograms' buckets and sums (they depend on the clock)."""
    text = client.get("/metrics").text
    return [
        line
        for line in text.splitlines()
        if not re.match(r"\w*(seconds_bucket|seconds_sum|_created)\b", line) and not line.startswith("# ")
    ]


RERANK_PATHS = {"/v1/rerank", "/rerank", "/v1/v1/rerank", "/v2/rerank", "/v1/v2/rerank", "/score", "/v1/score"}


def test_every_rerank_route_is_direct_and_lean(open_pair):
    _, _, direct_spy, _ = open_pair
    assert direct_spy.direct.paths == direct_spy.direct.lean_paths == RERANK_PATHS


def test_direct_answers_match_litestar(open_pair):
    direct, routed, direct_spy, routed_spy = open_pair
    statuses = []
    for i, (path, body) in enumerate(OPEN_CASES):
        with capture_logs() as logs:
            a = _exchange(direct, path, body, f"case-{i}", {})
            b = _exchange(routed, path + "/", body, f"case-{i}", {})
        _same(a, b, f"{path} {body[:60]!r}")
        lines = [{k: v for k, v in e.items() if k != "latency_ms"} for e in logs if e["event"] == "request"]
        assert len(lines) == 2 and lines[0] == lines[1], lines  # the same access-log line
        statuses.append(a[0])
    # The cases cover answers and each kind of error.
    assert {200, 400, 404, 413, 422} <= set(statuses), statuses
    # Both apps counted the same requests with the same labels.
    assert _metrics(direct) == _metrics(routed)
    # The first app served every POST directly, the second none.
    assert [served for path, served in direct_spy.served if path != "/metrics"] == [True] * len(OPEN_CASES)
    assert not any(served for _, served in routed_spy.served)


@pytest.mark.parametrize(("body", "status"), [(_json(V2), 200), (_json({**V2, "documents": ["x" * MAX_BODY]}), 413)])
def test_chunked_bodies_match_litestar(open_pair, body, status):
    """No content-length: the size limit is enforced on the bytes streamed (Litestar's reader)."""
    direct, routed, direct_spy, _ = open_pair

    def chunks():
        for start in range(0, len(body), 1000):
            yield body[start : start + 1000]

    answers = []
    for client, path in ((direct, "/v2/rerank"), (routed, "/v2/rerank/")):
        resp = client.post(
            path, content=chunks(), headers={"content-type": "application/json", "x-request-id": "chunked"}
        )
        assert "content-length" not in resp.request.headers
        answers.append((resp.status_code, resp.content, dict(resp.headers)))
    _same(answers[0], answers[1], "chunked")
    assert answers[0][0] == status
    assert direct_spy.served[-1] == ("/v2/rerank", True)


def test_keys_and_limits_match_litestar(keyed_pair):
    direct, routed, direct_spy, _ = keyed_pair
    steps = [
        ({}, "no key"),
        ({"authorization": "Bearer rr-not-a-key"}, "wrong key"),
        *[({"authorization": f"Bearer {KEY}"}, f"request {n}") for n in range(1, 4)],  # two paths each: rpm 3
    ]
    statuses = []
    for i, (headers, case) in enumerate(steps):
        for path, body in (("/v2/rerank", _json(V2)), ("/score", _json({"text_1": "q", "text_2": ["a"]}))):
            a = _exchange(direct, path, body, f"k-{i}-{path}", headers)
            b = _exchange(routed, path + "/", body, f"k-{i}-{path}", headers)
            _same(a, b, f"{case} {path}")
            statuses.append(a[0])
    assert statuses == [401] * 4 + [200] * 3 + [429] * 3
    assert any("ratelimit" in name for name in a[2])  # the limiter's headers were compared
    assert _metrics(direct) == _metrics(routed)
    assert all(served for path, served in direct_spy.served if path != "/metrics")


@pytest.mark.parametrize(
    ("path", "headers", "reason"),
    [
        ("/v2/rerank/", {}, "trailing slash: Litestar normalizes"),
        ("/V2/rerank", {}, "another path: Litestar's 404"),
        ("/v2/rerank", {"host": "a b"}, "a Host header Litestar refuses (400)"),
        ("/v2/rerank", {"host": "user@example.com"}, "a Host header Litestar accepts, outside ours"),
    ],
)
def test_what_direct_routes_leave_to_litestar(open_pair, path, headers, reason):
    direct, _, direct_spy, _ = open_pair
    before = len(direct_spy.served)
    status = direct.post(path, content=_json(V2), headers={"content-type": "application/json", **headers}).status_code
    assert direct_spy.served[before:] == [(path, False)], reason
    assert status == {"/v2/rerank/": 200, "/V2/rerank": 404}.get(path, 400 if headers.get("host") == "a b" else 200)


def test_other_methods_are_litestars(open_pair):
    direct, _, direct_spy, _ = open_pair
    before = len(direct_spy.served)
    resp = direct.get("/v2/rerank")
    assert resp.status_code == 405 and set(resp.json()) == {"message", "id", "detail"}
    assert direct_spy.served[before:] == [("/v2/rerank", False)]


# -- which routes and apps are served directly ---------------------------------------------------
def _tiny_app(*handlers: Any, **app_kwargs: Any) -> Litestar:
    def answer(request: Any, exc: Exception) -> Response[dict[str, str]]:
        return Response({"error": type(exc).__name__}, status_code=500)

    # logging_config=None as create_app has it: Litestar's own exception logging is not reproduced.
    app_kwargs.setdefault("logging_config", None)
    return Litestar(route_handlers=list(handlers), exception_handlers={Exception: answer}, **app_kwargs)


def _handlers() -> dict[str, Any]:
    async def boom() -> None:
        raise RuntimeError("after the answer")

    @post("/plain", dto=StrictBody[dict[str, int]], return_dto=None)
    async def plain(request: Request[Any, Any, Any], data: JSONBody[dict[str, int]]) -> Response[dict[str, int]]:
        return Response(data, status_code=200)

    @post("/late-error", dto=StrictBody[dict[str, int]], return_dto=None)
    async def late_error(request: Request[Any, Any, Any], data: JSONBody[dict[str, int]]) -> Response[dict[str, int]]:
        return Response(data, status_code=200, background=BackgroundTask(boom))

    @post("/guarded", dto=StrictBody[dict[str, int]], return_dto=None, guards=[lambda connection, handler: None])
    async def guarded(request: Request[Any, Any, Any], data: JSONBody[dict[str, int]]) -> Response[dict[str, int]]:
        return Response(data)

    @post(
        "/with-dependency",
        dto=StrictBody[dict[str, int]],
        return_dto=None,
        dependencies={"x": Provide(lambda: 1, sync_to_thread=False)},
    )
    async def with_dependency(
        request: Request[Any, Any, Any], data: JSONBody[dict[str, int]], x: NamedDependency[int]
    ) -> Response[dict[str, int]]:
        return Response(data)

    @post("/items/{item:int}", dto=StrictBody[dict[str, int]], return_dto=None)
    async def path_param(
        request: Request[Any, Any, Any], data: JSONBody[dict[str, int]], item: FromPath[int]
    ) -> Response[dict[str, int]]:
        return Response(data)

    @post("/litestar-decoded")
    async def litestar_decoded(data: JSONBody[dict[str, int]]) -> dict[str, int]:
        return data

    @get("/read")
    async def read() -> dict[str, int]:
        return {}

    return {
        h.handler_name: h for h in (plain, late_error, guarded, with_dependency, path_param, litestar_decoded, read)
    }


def test_only_strict_request_data_handlers_are_direct():
    direct = DirectRoutes.build(_tiny_app(*_handlers().values()))
    # Both lean: a response with a background task is recognised per response and written by
    # Litestar's to_response (test_an_error_after_the_answer_started_propagates runs it).
    assert direct.paths == direct.lean_paths == {"/plain", "/late-error"}


@pytest.mark.parametrize(
    "app_kwargs",
    [
        {"cors_config": "cors"},
        {"before_send": [lambda message, scope: None]},
        {"after_exception": [lambda exc, scope: None]},
        {"allowed_hosts": ["example.com"]},
        {"logging_config": "default"},
    ],
    ids=["cors", "before_send", "after_exception", "allowed_hosts", "litestar_logging"],
)
def test_apps_that_wrap_routes_have_no_direct_routes(app_kwargs):
    made = {"cors": CORSConfig(), "default": LoggingConfig()}
    kwargs = {k: made.get(v, v) if isinstance(v, str) else v for k, v in app_kwargs.items()}
    assert DirectRoutes.build(_tiny_app(_handlers()["plain"], **kwargs)).paths == frozenset()


def test_an_error_after_the_answer_started_propagates():
    """Nothing can be answered any more: the exception reaches the server (which closes the
    connection), as from Litestar's own exception layer; the answer already sent stays."""
    route = DirectRoutes.build(_tiny_app(_handlers()["late_error"])).match(
        {"type": "http", "method": "POST", "path": "/late-error", "root_path": "", "headers": [(b"host", b"localhost")]}
    )
    assert route is not None
    sent: list[dict[str, Any]] = []
    body = iter([{"type": "http.request", "body": b'{"a": 1}', "more_body": False}])

    async def receive() -> dict[str, Any]:
        return next(body, {"type": "http.disconnect"})

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/late-error",
        "root_path": "",
        "headers": [],
        "state": {},
        "query_string": b"",
        "http_version": "1.1",
        "scheme": "http",
        "server": ("127.0.0.1", 80),
        "client": None,
    }
    with pytest.raises(RuntimeError, match="after the answer"):
        asyncio.run(route(scope, receive, send))
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[0]["status"] == 200 and sent[1]["body"] == b'{"a":1}'
