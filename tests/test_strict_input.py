"""Strict request decoding (issue #12, items 1 and 3): deep nesting is a 400, wrong types a 422.

In-process against a ``static`` model: these are properties of the decoder, not of an engine.
"""

from __future__ import annotations

import json

import pytest
from litestar.testing import TestClient

from gateway.app import create_app
from gateway.errors import InvalidRequestError, MalformedRequestError
from gateway.http.decoding import MAX_JSON_DEPTH, check_depth, decode_json
from schemas.config import Settings, StaticEngineConfig
from schemas.rerank import RerankRequest

ROUTES = ("/v1/rerank", "/v2/rerank", "/rerank")


@pytest.fixture(scope="module")
def client():
    app = create_app(Settings(models=(StaticEngineConfig(name="static"),)), configure_logs=False)
    with TestClient(app) as c:
        yield c


def _post(client, body: bytes | str, path: str = "/v2/rerank"):
    raw = body.encode() if isinstance(body, str) else body
    return client.post(path, content=raw, headers={"content-type": "application/json"})


def _assert_error(resp, status: int, *needles: str) -> str:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"message", "id", "detail"}, body
    assert body["id"] == resp.headers["x-request-id"]
    for needle in needles:
        assert needle in body["message"], body["message"]
    return body["message"]


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


# -- 1. deep nesting --------------------------------------------------------------------------

NESTED_BODIES = {
    "body": _nested(1000),
    "document": '{"model":"static","query":"q","documents":[{"text":"a","meta":' + _nested(1000) + "}]}",
    "query": '{"model":"static","query":' + _nested(1000) + ',"documents":["a"]}',
    "rank_fields": '{"model":"static","query":"q","documents":["a"],"rank_fields":' + _nested(1000) + "}",
    "objects": '{"model":"static","query":"q","documents":[' + '{"a":' * 1000 + "1" + "}" * 1000 + "]}",
    "unclosed": "[" * 100_000,
}


@pytest.mark.parametrize("where", sorted(NESTED_BODIES))
@pytest.mark.parametrize("path", ROUTES)
def test_deep_nesting_is_a_clear_400(client, where, path):
    _assert_error(_post(client, NESTED_BODIES[where], path), 400, "nested too deeply", str(MAX_JSON_DEPTH))


def test_nesting_at_the_limit_is_decoded(client):
    # 64 levels in total: the body object, the documents array, the document, then 61 more.
    inner = "[" * (MAX_JSON_DEPTH - 3) + "]" * (MAX_JSON_DEPTH - 3)
    body = '{"model":"static","query":"q","documents":[{"text":"a","meta":' + inner + "}]}"
    assert _post(client, body).status_code == 200
    deeper = body.replace(inner, "[" + inner + "]")
    _assert_error(_post(client, deeper), 400, "nested too deeply")


def test_brackets_inside_strings_do_not_count(client):
    text = "[" * 5000 + '\\"{' * 100
    body = json.dumps({"model": "static", "query": "[[[[", "documents": [text, "b"]})
    assert _post(client, body).status_code == 200


def test_check_depth_is_independent_of_the_decoder():
    check_depth(b"[" * 64 + b"]" * 64)
    with pytest.raises(MalformedRequestError):
        check_depth(b"[" * 65 + b"]" * 65)
    with pytest.raises(MalformedRequestError):
        check_depth(b'{"a":' * 65 + b"1" + b"}" * 65)
    check_depth(b'["' + b"[" * 1000 + b'"]')  # one string, depth 1


# -- 3. strict types: no coercion, 422 naming the field ---------------------------------------

WRONG_TYPES = [
    ("top_n", '"2"'),
    ("top_n", "1.5"),
    ("top_n", '"1e1"'),
    ("top_n", "true"),
    ("return_documents", '"true"'),
    ("return_documents", "1"),
    ("return_documents", "0"),
    ("priority", '"7"'),
    ("priority", "7.25"),
    ("max_tokens_per_doc", "2.5"),
    ("max_chunks_per_doc", "1e-1"),
    ("max_tokens_per_doc", '"5"'),
    ("max_chunks_per_doc", '"3"'),
    ("model", "7"),
    ("instruction", "1"),
    ("instruct", "false"),
    ("rank_fields", '"text"'),
    ("rank_fields", "[1]"),
    ("query", "1"),
    ("documents", '"a"'),
    ("documents", "[1]"),
]


@pytest.mark.parametrize(("field", "value"), WRONG_TYPES)
def test_wrong_types_are_422_naming_the_field(client, field, value):
    body = {"model": "static", "query": "q", "documents": ["a", "b"]}
    body.pop(field, None)
    raw = json.dumps(body)[:-1] + f', "{field}": {value}}}'
    message = _assert_error(_post(client, raw), 422, f"$.{field}")
    assert "Expected" in message


@pytest.mark.parametrize(
    ("field", "value"),
    [("top_n", 0), ("max_tokens_per_doc", 0), ("max_chunks_per_doc", -1), ("priority", 1000), ("top_n", 2**31)],
)
def test_out_of_range_integers_are_422(client, field, value):
    body = {"model": "static", "query": "q", "documents": ["a"], field: value}
    _assert_error(_post(client, json.dumps(body)), 422, f"$.{field}")


# -- integral numbers: JSON Schema's `integer` includes 148.0, so the gateway takes it ----------

INTEGRAL = [
    ("top_n", "1.0", 1),
    ("top_n", "1e0", 1),
    ("priority", "148.0", 148),
    ("priority", "0.0", 0),
    ("max_tokens_per_doc", "2.0", 2),
    ("max_chunks_per_doc", "3E0", 3),
    ("top_n", "-0.0e5", None),
]


@pytest.mark.parametrize("path", ROUTES)
@pytest.mark.parametrize(("field", "raw", "value"), INTEGRAL)
def test_integral_floats_are_integers(client, path, field, raw, value):
    body = '{"model":"static","query":"q","documents":["a","b","c"],"' + field + '":' + raw + "}"
    resp = _post(client, body, path)
    if value is None:  # -0.0 is the integer 0: out of top_n's range, the same 422 as 0
        _assert_error(resp, 422, "$.top_n", ">= 1")
        return
    assert resp.status_code == 200, resp.text
    # The same answer as the integer itself (ids differ).
    same = _post(client, body.replace(raw, str(value)), path)
    assert [r["index"] for r in resp.json()["results"]] == [r["index"] for r in same.json()["results"]]


@pytest.mark.parametrize("path", ROUTES)
def test_integral_floats_keep_ranges_and_leave_documents_alone(client, path):
    _assert_error(
        _post(client, '{"model":"static","query":"q","documents":["a"],"top_n":1e10}', path),
        422,
        "$.top_n",
        "<= 2147483647",
    )
    _assert_error(
        _post(client, '{"model":"static","query":"q","documents":["a"],"priority":1e400}', path),
        422,
        "$.priority",
        "out of range",
    )
    # A float inside a document is the client's data, echoed as sent: 2.0 stays 2.0.
    body = '{"model":"static","query":"q","documents":[{"text":"a","n":2.0}],"top_n":1.0,"return_documents":true}'
    resp = _post(client, body, path)
    assert resp.status_code == 200, resp.text
    assert '"n":2.0' in resp.text


def test_integral_floats_in_vllm_score_and_decode_builtins(client):
    body = {"model": "static", "text_1": "q", "text_2": ["a", "b"], "max_tokens_per_doc": 3.0}
    resp = client.post("/score", json=body)
    assert resp.status_code == 200, resp.text
    resp = client.post("/score", json={**body, "max_tokens_per_doc": 3.5})
    assert resp.status_code == 400 and "max_tokens_per_doc" in resp.text
    from gateway.http.decoding import _integral, _type_info

    fixed = _integral(
        {"query": "q", "documents": [{"n": 1.0}], "top_n": 2.0, "priority": None}, _type_info(RerankRequest)
    )
    assert fixed == {"query": "q", "documents": [{"n": 1.0}], "top_n": 2, "priority": None}
    assert type(fixed["top_n"]) is int and type(fixed["documents"][0]["n"]) is float


def _integer_fields(openapi: dict, schema: dict) -> dict[str, int]:
    """Top-level request fields the OpenAPI types `integer`, each with the smallest value it allows."""
    while "$ref" in schema:
        schema = openapi["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    fields = {}
    for name, prop in schema.get("properties", {}).items():
        for option in prop.get("anyOf", [prop]):
            if option.get("type") == "integer":
                fields[name] = max(option.get("minimum", 1), 1)
    return fields


def test_every_integer_of_the_openapi_takes_an_integral_float(client):
    # The wire must take what the served schema promises: JSON Schema's integer includes 1.0.
    openapi = client.get("/schema/openapi.json").json()
    bases = {
        "RerankRequest": {"model": "static", "query": "q", "documents": ["a", "b"]},
        "VllmScoreRequest": {"model": "static", "text_1": "q", "text_2": ["a", "b"]},
    }
    tried = set()
    for path, ops in openapi["paths"].items():
        request = ops.get("post", {}).get("requestBody")
        if request is None:
            continue
        schema = request["content"]["application/json"]["schema"]
        for option in schema.get("anyOf", [schema]):
            name = option["$ref"].rsplit("/", 1)[1]
            base = bases.get(name.removesuffix("V2"))
            if base is None:  # TEI's body has no integer field
                assert not _integer_fields(openapi, option), name
                continue
            for field, value in _integer_fields(openapi, option).items():
                resp = client.post(path, json={**base, field: float(value)})
                assert resp.status_code == 200, (path, field, resp.text)
                tried.add((name, field))
    assert {f for _, f in tried} == {"top_n", "priority", "max_tokens_per_doc", "max_chunks_per_doc"}


def test_correct_types_still_accepted(client):
    body = {
        "model": "static",
        "query": {"text": "q"},
        "documents": ["a", {"text": "b", "n": 1.5}],
        "top_n": 1,
        "return_documents": True,
        "priority": 7,
        "max_tokens_per_doc": 5,
        "max_chunks_per_doc": 2,
        "instruction": None,
    }
    resp = _post(client, json.dumps(body))
    assert resp.status_code == 200, resp.text
    assert len(resp.json()["results"]) == 1


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (b"", "empty"),
        (b"   \n", "empty"),
        (b'{"model":"static","query":"q","documents":["a"]} trailing', "malformed"),
        (b'{"model":"static","query":NaN,"documents":["a"]}', "malformed"),
        (b'{"model":"static","query":"q","documents":[Infinity]}', "malformed"),
        (b'{"model":"static","query":"\\ud800","documents":["a"]}', "malformed"),
        (b'{"model":"static","query":"q","documents":["\xff\xfe"]}', "malformed"),
        (b'\xef\xbb\xbf{"model":"static","query":"q","documents":["a"]}', "malformed"),
    ],
)
def test_malformed_bodies_are_400(client, raw, needle):
    _assert_error(_post(client, raw), 400, needle)


def test_decode_json_maps_every_failure():
    assert decode_json(b'{"query":"q","documents":["a"]}', RerankRequest).query == "q"
    with pytest.raises(InvalidRequestError, match=r"\$\.top_n"):
        decode_json(b'{"query":"q","documents":["a"],"top_n":"2"}', RerankRequest)
    with pytest.raises(MalformedRequestError):
        decode_json(b"{", RerankRequest)


def test_too_many_arrays_is_a_400_and_the_check_stays_cheap():
    from gateway.http.decoding import MAX_JSON_CONTAINERS

    flat = b"[" + b"[]," * (MAX_JSON_CONTAINERS + 1) + b"[]]"
    with pytest.raises(MalformedRequestError, match="too many arrays/objects"):
        check_depth(flat)
    # Many sequences just under the limit, then one just over it, at the end of the body.
    almost = b"[" + (b"[" * 63 + b"]" * 63 + b",") * 5000
    check_depth(almost + b"[]]")
    with pytest.raises(MalformedRequestError, match="nested too deeply"):
        check_depth(almost + b"[" * 64 + b"]" * 64 + b"]")
