"""Environment variables the gateway reads as config overrides."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config.settings import load_settings
from gateway.security.auth import hash_key

STATIC = '[[models]]\nname = "m"\nengine = "static"\n'

# What the kubelet injects into every pod of a namespace holding a Service (enableServiceLinks
# defaults to true): deploy/k8s/gateway.yaml's Service is named "rerank-gateway", and a user's
# Service named "rerank" gives RERANK_SERVICE_HOST / RERANK_PORT.
SERVICE_LINKS = {
    "RERANK_GATEWAY_SERVICE_HOST": "10.96.0.12",
    "RERANK_GATEWAY_SERVICE_PORT": "80",
    "RERANK_GATEWAY_SERVICE_PORT_HTTP": "80",
    "RERANK_GATEWAY_PORT": "tcp://10.96.0.12:80",
    "RERANK_GATEWAY_PORT_80_TCP": "tcp://10.96.0.12:80",
    "RERANK_GATEWAY_PORT_80_TCP_PROTO": "tcp",
    "RERANK_GATEWAY_PORT_80_TCP_PORT": "80",
    "RERANK_GATEWAY_PORT_80_TCP_ADDR": "10.96.0.12",
    "RERANK_GATEWAY_GPU_SERVICE_HOST": "10.96.0.13",
    "RERANK_GATEWAY_GPU_PORT": "tcp://10.96.0.13:80",
    "RERANK_SERVICE_HOST": "10.96.0.14",
    "RERANK_SERVICE_PORT": "80",
    "RERANK_PORT": "tcp://10.96.0.14:80",
    "RERANK_PORT_80_TCP_ADDR": "10.96.0.14",
}


def test_kubernetes_service_link_variables_do_not_stop_the_gateway(tmp_path: Path) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text(STATIC)
    # Before: ConfigError "the config has no field 'gateway_port'": every pod restarted after the
    # Service exists exits 2 (CrashLoopBackOff).
    settings = load_settings(config, environ={**SERVICE_LINKS, "RERANK_SERVER__PORT": "9000"})
    assert settings.server.port == 9000
    assert [m.name for m in settings.models] == ["m"]


def test_a_typo_in_a_real_override_still_fails(tmp_path: Path) -> None:
    from gateway.config.settings import ConfigError

    config = tmp_path / "gateway.toml"
    config.write_text(STATIC)
    with pytest.raises(ConfigError, match="RERANK_SERVR__PORT"):
        load_settings(config, environ={"RERANK_SERVR__PORT": "9000"})
    with pytest.raises(ConfigError, match="RERANK_SERVER_PORT"):
        load_settings(config, environ={"RERANK_SERVER_PORT": "9000"})


def test_deploy_manifests_turn_service_links_off() -> None:
    root = Path(__file__).resolve().parents[1]
    for name in ("gateway.yaml", "gateway-gpu.yaml"):
        text = (root / "deploy" / "k8s" / name).read_text()
        assert "enableServiceLinks: false" in text, name


def test_env_keys_as_json_combine_with_rerank_api_key(tmp_path: Path) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text(STATIC)
    keys = '[{"id": "a", "hash": "' + hash_key("rk-" + "a" * 40) + '", "models": ["*"]}]'
    # Before: "auth.keys[0]: expected a table, got a string" (the JSON text was spread into characters).
    settings = load_settings(config, environ={"RERANK_AUTH__KEYS": keys, "RERANK_API_KEY": "rk-" + "b" * 40})
    assert [k.id for k in settings.auth.keys] == ["a", "env"]


def test_sighup_reload_names_every_section_it_does_not_apply() -> None:
    """docs/operating.md: `restart_needed_for` lists the other sections that differ."""
    from structlog.testing import capture_logs

    from gateway.http.access import AccessControl
    from schemas.config import DialectsConfig, Settings, StaticEngineConfig

    old = Settings(models=(StaticEngineConfig(name="m"),))
    new = Settings(models=(StaticEngineConfig(name="m"),), dialects=DialectsConfig(jina_models=()))
    control = AccessControl(old)
    with capture_logs() as logs:
        assert control.reload_keys(lambda: new) is True
    line = next(e for e in logs if e["event"] == "keys_reloaded")
    # Before: no restart_needed_for although dialects.jina_models changed and is not applied.
    assert line.get("restart_needed_for") == ["dialects"]
