"""DashScope errors about the gateway operator's own account are not the client's fault.

DashScope answers an overdue account with HTTP 400 ``Arrearage`` and a model or operation the
account/endpoint cannot use with 400 ``UnsupportedOperation``: 400s, but nothing the client can
change in its request. They must be the same 502 as a refused key (401 ``InvalidApiKey``), not a
422 telling the client its request is invalid, and must not quote the upstream key.
"""

from __future__ import annotations

import os

import pytest
import structlog
from litestar.testing import TestClient

from gateway.app import create_app
from schemas.config import DashScopeEngineConfig, Settings
from tests.fake_dashscope import FakeDashScope, Fault
from tests.loopback import wait_loaded

KEY = "sk-test-fixb-0123456789abcdef"
KEY_ENV = "RERANK_TEST_FIXB_DASHSCOPE_KEY"
BODY = {"model": "ds", "query": "q", "documents": ["a", "b"]}


@pytest.fixture(scope="module")
def fake():
    with FakeDashScope(api_key=KEY) as server:
        yield server


@pytest.fixture(scope="module")
def client(fake):
    os.environ[KEY_ENV] = KEY
    model = DashScopeEngineConfig(
        name="ds",
        model="gte-rerank-v2",
        base_url=fake.url,
        api_key_env=KEY_ENV,
        retries=2,
        backoff_initial_s=0.05,
        backoff_max_s=0.2,
    )
    with TestClient(create_app(Settings(models=(model,)), configure_logs=False)) as c:
        wait_loaded(c)
        yield c
    os.environ.pop(KEY_ENV, None)


@pytest.mark.parametrize(
    ("code", "message"),
    [
        ("Arrearage", "Access denied, please make sure your account is in good standing."),
        ("UnsupportedOperation", "The operation is unsupported on the referee object."),
    ],
)
def test_account_side_400_is_502_not_422(client, fake, code, message):
    fake.requests.clear()
    fake.fail_next(Fault(400, code, message))
    with structlog.testing.capture_logs() as logs:
        r = client.post("/v1/rerank", json=BODY)
    assert r.status_code == 502, r.text
    assert r.json()["message"] == "the model's engine failed to score this request"
    assert KEY not in r.text and not any(KEY in repr(e) for e in logs)
    assert any(e["event"] == "dashscope_account_refused" and e["code"] == code for e in logs), logs
    assert len(fake.requests) == 1  # not retried: paying the bill takes longer than a request


def test_client_side_400_stays_422(client, fake):
    fake.fail_next(Fault(400, "DataInspectionFailed", "Input data may contain inappropriate content."))
    r = client.post("/v1/rerank", json=BODY)
    assert r.status_code == 422, r.text
    assert "DataInspectionFailed" in r.json()["message"]
