"""AWS Bedrock rerank through the whole gateway: boto3 signs every call with SigV4 and the fake
(tests/fake_bedrock.py) checks the signature, the body's shape and the limits, and fails as scripted."""

from __future__ import annotations

import asyncio
import os
import tempfile

import pytest
import structlog

from adapters.base import EngineConfigError
from adapters.upstreams.hosted.bedrock import BedrockEngine
from schemas.config import BedrockEngineConfig, Settings
from tests.fake_bedrock import BedrockFault, FakeBedrock
from tests.fake_providers import fake_tokens
from tests.hosted_gateway import DOCS, Q, assert_ranked, gateway_client, rerank

KEY_ID = "AKIDTESTBEDROCK0001"
SECRET = "bedrock-secret-access-key-0123456789abcdef"
WRONG_SECRET = "wrong-bedrock-secret-key-fedcba9876543210"
REGION = "us-west-2"
MODEL = "amazon.rerank-v1:0"
ARN = f"arn:aws:bedrock:{REGION}::foundation-model/{MODEL}"


STARTUP_LOGS: list[dict[str, object]] = []


@pytest.fixture(scope="module")
def fake():
    with FakeBedrock(KEY_ID, SECRET, REGION) as server:
        yield server


@pytest.fixture(scope="module")
def client(fake):
    with tempfile.TemporaryDirectory() as folder, pytest.MonkeyPatch.context() as env:
        credentials = os.path.join(folder, "credentials")
        with open(credentials, "w") as file:  # a profile whose secret the fake does not know
            file.write(f"[wrong]\naws_access_key_id = {KEY_ID}\naws_secret_access_key = {WRONG_SECRET}\n")
        for var, value in {
            "AWS_ACCESS_KEY_ID": KEY_ID,
            "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_SHARED_CREDENTIALS_FILE": credentials,
            "AWS_CONFIG_FILE": os.path.join(folder, "config"),
            "AWS_EC2_METADATA_DISABLED": "true",
        }.items():
            env.setenv(var, value)
        base = {
            "model": MODEL,
            "region": REGION,
            "endpoint_url": fake.url,
            "max_documents_per_call": 4,
            "retries": 2,
            "backoff_initial_s": 0.05,
            "backoff_max_s": 0.2,
        }
        models = (
            BedrockEngineConfig(name="bedrock", **base),
            BedrockEngineConfig(name="bedrock-slow", **{**base, "read_timeout_s": 0.3}),
            BedrockEngineConfig(name="bedrock-wrong", **{**base, "profile": "wrong"}),
            BedrockEngineConfig(name="bedrock-noprofile", **{**base, "profile": "no-such-profile"}),
        )
        with gateway_client(Settings(models=models), STARTUP_LOGS) as c:
            yield c


@pytest.fixture(autouse=True)
def _fresh(fake):
    fake.clear()
    yield
    assert fake.pending() == 0, "a scripted fault was not consumed"


def _sources(texts):
    return [{"type": "INLINE", "inlineDocumentSource": {"type": "TEXT", "textDocument": {"text": t}}} for t in texts]


def test_signed_calls_split_and_merged(client, fake):
    body = assert_ranked(rerank(client, "bedrock", top_n=3, return_documents=True), 3)
    calls = sorted(fake.calls, key=lambda c: len(c["sources"]), reverse=True)
    for call, part in zip(calls, (DOCS[:4], DOCS[4:]), strict=True):  # signatures checked by the fake
        assert call == {
            "queries": [{"type": "TEXT", "textQuery": {"text": Q}}],
            "sources": _sources(part),
            "rerankingConfiguration": {
                "type": "BEDROCK_RERANKING_MODEL",
                "bedrockRerankingConfiguration": {
                    "numberOfResults": len(part),
                    "modelConfiguration": {"modelArn": ARN},
                },
            },
        }
    # Rerank reports no usage: the gateway's estimate, which errs high.
    assert body["usage"]["total_tokens"] >= fake_tokens(Q) * 5 + sum(map(fake_tokens, DOCS))


# AWS's error types for Rerank (botocore's service model), the status AWS sends each with, what the client gets.
ERRORS = [
    ("ValidationException", 400, 422),
    ("AccessDeniedException", 403, 502),
    ("ServiceQuotaExceededException", 400, 502),  # the account's quota, whatever its 400 says
    ("ResourceNotFoundException", 404, 502),
    ("DependencyFailedException", 424, 502),
    ("ConflictException", 409, 502),
    ("ThrottlingException", 429, 200),  # retried
    ("InternalServerException", 500, 200),  # retried ("Retry your request")
    ("BadGatewayException", 502, 200),  # retried
]


@pytest.mark.parametrize(("code", "status", "expected"), ERRORS, ids=[e[0] for e in ERRORS])
def test_each_documented_error_is_mapped(client, fake, code, status, expected):
    fake.fail_next(BedrockFault(status, code, f"documented {code}"))
    r = rerank(client, "bedrock", documents=DOCS[:2])
    assert r.status_code == expected, r.text
    assert len(fake.calls) == (2 if expected == 200 else 1)
    if expected == 422:
        assert f"documented {code}" in r.json()["message"]
    if code == "ResourceNotFoundException":
        assert "is misconfigured" in r.json()["message"]


def test_persistent_throttling_is_503(client, fake):
    fake.fail_next(*[BedrockFault(429, "ThrottlingException")] * 3)
    r = rerank(client, "bedrock", documents=DOCS[:2])
    assert r.status_code == 503 and "retry-after" in r.headers
    assert len(fake.calls) == 3  # the SDK's own retries are off: only the gateway's 2


def test_slow_bedrock_is_504(client, fake):
    fake.fail_next(BedrockFault(200, "none", delay_s=5))
    r = rerank(client, "bedrock-slow", documents=DOCS[:2])
    assert r.status_code == 504


def test_a_document_over_bedrocks_limit_is_422(client, fake):
    r = rerank(client, "bedrock", documents=["x" * 32001, "y"])
    assert r.status_code == 422, r.text
    assert fake.calls == []  # the SDK refuses it before sending


def test_wrong_secret_is_502_and_no_secret_is_logged_or_shown(client, fake):
    with structlog.testing.capture_logs() as logs:
        refused = rerank(client, "bedrock-wrong", documents=DOCS[:2])
        served = rerank(client, "bedrock", documents=DOCS[:2])
        ready = client.get("/ready")
    assert refused.status_code == 502 and served.status_code == 200
    assert any(e["event"] == "hosted_account_refused" and e["code"] == "InvalidSignatureException" for e in logs)
    for secret in (SECRET, WRONG_SECRET):
        assert secret not in refused.text + served.text + ready.text
        assert not any(secret in repr(e) for e in logs + STARTUP_LOGS)
    assert STARTUP_LOGS, "the models' start was not captured"


def test_missing_profile_fails_the_model_with_a_hint(client):
    r = rerank(client, "bedrock-noprofile")
    assert r.status_code == 503
    assert "no-such-profile" in r.json()["message"]


def test_no_credentials_fail_at_start(monkeypatch, tmp_path):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    engine = BedrockEngine(BedrockEngineConfig(name="b", model=MODEL, region=REGION))
    with pytest.raises(EngineConfigError, match="no AWS credentials"):
        asyncio.run(engine.start())


def test_model_arn():
    assert BedrockEngineConfig(name="b", model=MODEL, region="eu-central-1").model_arn == (
        f"arn:aws:bedrock:eu-central-1::foundation-model/{MODEL}"
    )
    arn = "arn:aws:bedrock:us-east-1:123456789012:provisioned-model/abc"
    assert BedrockEngineConfig(name="b", model=arn, region=REGION).model_arn == arn
