"""What the tests of hosted upstreams through the whole gateway share (test_bedrock, test_dashscope,
test_hosted_providers): the query and documents they rank, the gateway they start, the rerank call
and the check of a ranking by the fakes' score."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import structlog
from litestar.testing import TestClient

from gateway.app import create_app
from schemas.config import Settings
from tests.fake_providers import fake_score
from tests.loopback import wait_loaded

Q = "What is the capital of the United States?"
DOCS = [
    "Carson City is the capital city of the American state of Nevada.",
    "Washington, D.C. is the capital of the United States.",
    "Capital punishment has existed in the United States since before it was a country.",
    "The quick brown fox.",
    "Paris is the capital of France.",
]


@contextlib.contextmanager
def gateway_client(settings: Settings, startup_logs: list[dict[str, Any]]) -> Iterator[TestClient]:
    """A TestClient on the gateway of ``settings`` once its models loaded; ``startup_logs`` holds
    what the app and its models logged while they started (a test checks no secret is in them)."""
    with contextlib.ExitStack() as stack:
        with structlog.testing.capture_logs() as startup:
            client = stack.enter_context(TestClient(create_app(settings, configure_logs=False)))
            wait_loaded(client)
        startup_logs[:] = startup
        yield client


def rerank(client, model, documents=DOCS, **extra):
    return client.post("/v1/rerank", json={"model": model, "query": Q, "documents": documents, **extra})


def assert_ranked(response, top: int) -> dict[str, Any]:
    """``response`` (to a rerank of DOCS with ``top_n=top, return_documents=True``) holds the ``top``
    best of DOCS by ``fake_score``, best first, each with its score and text; its body."""
    assert response.status_code == 200, response.text
    body = response.json()
    expected = sorted(range(len(DOCS)), key=lambda i: -fake_score(Q, DOCS[i]))[:top]
    assert [x["index"] for x in body["results"]] == expected
    for x in body["results"]:
        assert x["relevance_score"] == pytest.approx(fake_score(Q, DOCS[x["index"]]), abs=1e-9)
        assert x["document"] == {"text": DOCS[x["index"]]}
    return body
