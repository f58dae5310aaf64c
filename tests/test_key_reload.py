"""Reloading API keys without a restart: a real process, a real SIGHUP, traffic never stops.

One gateway process serves a static model with key A. A client thread sends requests with key A
the whole time; meanwhile the config file gains key B (SIGHUP -> B gets 200), loses it again
(SIGHUP -> B gets 401), and is replaced by a broken file (SIGHUP -> one log line, the keys stay).
Every request of key A must succeed throughout.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from gateway.security.auth import generate_key, hash_key
from tests.conftest import ServerProcess

KEY_A, KEY_B = generate_key(), generate_key()
MODEL = '[[models]]\nname = "m"\nengine = "static"\ndelay_s = 0.01\n'


def key_toml(name: str, key: str) -> str:
    return f'[[auth.keys]]\nid = "{name}"\nhash = "{hash_key(key)}"\nmodels = ["*"]\n'


def rerank(url: str, key: str) -> int:
    body = {"model": "m", "query": "q", "documents": ["a", "b"]}
    return httpx.post(f"{url}/v2/rerank", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=10).status_code


def until(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def log_lines(server: ServerProcess, event: str) -> list[dict]:
    out = []
    for line in server.output().splitlines():
        if line.startswith("{") and f'"{event}"' in line:
            out.append(json.loads(line))
    return out


def test_reload_keeps_the_keys_when_the_config_cannot_be_read_or_exposes_the_gateway() -> None:
    from gateway.http.access import AccessControl
    from schemas.config import ApiKeyConfig, AuthConfig, ServerConfig, Settings, StaticEngineConfig

    def settings(*keys: tuple[str, str], host: str = "0.0.0.0") -> Settings:
        entries = tuple(ApiKeyConfig(id=name, hash=hash_key(key), models=("*",)) for name, key in keys)
        return Settings(
            server=ServerConfig(host=host), auth=AuthConfig(keys=entries), models=(StaticEngineConfig(name="m"),)
        )

    control = AccessControl(settings(("a", KEY_A)))
    header = [(b"authorization", f"Bearer {KEY_A}".encode())]

    def unreadable() -> Settings:
        raise PermissionError("config")

    assert control.reload_keys(unreadable) is False
    assert control.reload_keys(lambda: settings()) is False  # 0.0.0.0 without keys: refused
    assert control.keys.authenticate(header).id == "a"
    assert control.reload_keys(lambda: settings(("b", KEY_B))) is True
    assert control.keys.authenticate([(b"authorization", f"Bearer {KEY_B}".encode())]).id == "b"


@pytest.mark.slow
def test_sighup_adds_and_revokes_keys_while_traffic_flows(tmp_path: Path, gateway_server) -> None:
    server: ServerProcess = gateway_server('[logging]\nformat = "json"\n' + MODEL + key_toml("a", KEY_A))
    config: Path = server.config
    statuses: list[int] = []
    stop = threading.Event()

    def traffic() -> None:
        with httpx.Client(timeout=10) as client:
            body = {"model": "m", "query": "q", "documents": ["a", "b"]}
            while not stop.is_set():
                resp = client.post(f"{server.url}/v2/rerank", json=body, headers={"Authorization": f"Bearer {KEY_A}"})
                statuses.append(resp.status_code)

    worker = threading.Thread(target=traffic)
    worker.start()
    try:
        assert rerank(server.url, KEY_B) == 401
        config.write_text('[logging]\nformat = "json"\n' + MODEL + key_toml("a", KEY_A) + key_toml("b", KEY_B))
        server.proc.send_signal(signal.SIGHUP)
        until(lambda: rerank(server.url, KEY_B) == 200, "key b was not added")

        config.write_text('[logging]\nformat = "json"\n' + MODEL + key_toml("a", KEY_A))
        server.proc.send_signal(signal.SIGHUP)
        until(lambda: rerank(server.url, KEY_B) == 401, "key b was not revoked")

        # A broken config (key a's hash twice) is refused; the keys in force stay.
        config.write_text(MODEL + key_toml("a", KEY_A) + key_toml("a2", KEY_A))
        server.proc.send_signal(signal.SIGHUP)
        until(lambda: bool(log_lines(server, "keys_reload_rejected")), "no keys_reload_rejected line")
        assert rerank(server.url, KEY_A) == 200 and rerank(server.url, KEY_B) == 401
        time.sleep(0.3)  # more traffic after the refused reload
    finally:
        stop.set()
        worker.join(timeout=30)
    assert server.proc.poll() is None, "the gateway exited"
    assert len(statuses) > 20 and set(statuses) == {200}, sorted(set(statuses))
    reloaded = log_lines(server, "keys_reloaded")
    assert [(r["added"], r["removed"]) for r in reloaded] == [(["b"], []), ([], ["b"])]
    (rejected,) = log_lines(server, "keys_reload_rejected")
    assert "same hash as another key" in rejected["error"] and rejected["level"] == "error"
    assert KEY_A not in server.output() and hash_key(KEY_A)[7:] not in server.output()
