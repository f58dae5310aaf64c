"""An empty Redis URL (RERANK_LIMITS__REDIS_URL="", RERANK_CACHE__REDIS_URL="") means "not set".

As with the other empty variables the gateway reads (RERANK_CONFIG, RERANK_API_KEY): a
deployment template that passes ``${REDIS_URL:-}`` through must start with per-process limits,
not crash in the app's startup with redis-py's "Redis URL must specify one of the following
schemes" (which check-config did not catch).
"""

from __future__ import annotations

import msgspec
import pytest
from litestar.testing import TestClient

from gateway.app import create_app
from gateway.config.settings import ConfigError, load_settings
from gateway.launch.preflight import preflight
from gateway.security.auth import generate_key, hash_key
from gateway.security.ratelimit import KeyLimiter
from schemas.config import ApiKeyConfig, AuthConfig, StaticEngineConfig

KEY = generate_key()


def _settings(**env: str):
    settings = load_settings(environ={"RERANK_LIMITS__REDIS_URL": "", **env})
    key = ApiKeyConfig(id="k", hash=hash_key(KEY), models=("*",), rpm=1, max_concurrent=1)
    return msgspec.structs.replace(settings, models=(StaticEngineConfig(name="m"),), auth=AuthConfig(keys=(key,)))


def test_empty_limits_redis_url_is_per_process_limits() -> None:
    settings = _settings()
    assert settings.limits.redis_url == ""  # what the environment gave: the consumers treat it as unset
    assert not KeyLimiter(settings.limits).shared
    with TestClient(create_app(settings, configure_logs=False)) as client:
        body = {"model": "m", "query": "q", "documents": ["a"]}
        headers = {"Authorization": f"Bearer {KEY}"}
        assert client.post("/v1/rerank", json=body, headers=headers).status_code == 200
        # Still limited, by this process's counters (rpm = 1), with no Redis tried.
        assert client.post("/v1/rerank", json=body, headers=headers).status_code == 429


def test_empty_cache_redis_url_is_refused_in_one_line() -> None:
    settings = _settings(RERANK_CACHE__ENABLED="true", RERANK_CACHE__BACKEND="redis", RERANK_CACHE__REDIS_URL="")
    with pytest.raises(ConfigError, match="cache.redis_url or limits.redis_url"):
        create_app(settings, configure_logs=False)
    # check-config says the same before serve would start.
    report = preflight(settings)
    assert [f.message for f in report.findings if f.refuses and "cache.redis_url" in f.message]
