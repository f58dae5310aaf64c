"""A key scoped to no configured model is warned about, not found out by its 403s.

Scopes match canonical model names only, so a key scoped to an alias, or to a typo, got 403 on
every request while ``check-config`` said "config OK" and a SIGHUP reload said nothing. Such keys
are still accepted (a key may be made before its model is deployed), with a warning naming them.
"""

from __future__ import annotations

from pathlib import Path

from structlog.testing import capture_logs

from gateway import cli
from gateway.http.access import AccessControl
from gateway.security.auth import generate_key, hash_key
from schemas.config import ApiKeyConfig, AuthConfig, Settings, StaticEngineConfig

MODELS = '[[models]]\nname = "m"\nengine = "static"\naliases = ["m-alias"]\n[[models]]\nname = "x"\nengine = "static"\n'


def key_toml(name: str, *models: str) -> str:
    scopes = ", ".join(f'"{m}"' for m in models)
    return f'[[auth.keys]]\nid = "{name}"\nhash = "{hash_key(generate_key())}"\nmodels = [{scopes}]\n'


def test_check_config_warns_of_scopes_matching_no_model(tmp_path: Path, capsys) -> None:
    config = tmp_path / "g.toml"
    keys = key_toml("alias", "m-alias") + key_toml("typo", "qwen-*", "x") + key_toml("ok", "m", "x*", "*")
    config.write_text(MODELS + keys)
    assert cli.main(["check-config", "--config", str(config)]) == 0
    out, err = capsys.readouterr()
    assert "config OK" in out
    warnings = [line for line in err.splitlines() if line.strip()]
    assert len(warnings) == 2, err
    assert "auth.keys[0] (alias)" in warnings[0] and "'m-alias' is an alias of 'm'" in warnings[0]
    assert "auth.keys[1] (typo)" in warnings[1] and "'qwen-*' matches no configured model" in warnings[1]


def test_reload_logs_a_key_scoped_to_no_model() -> None:
    def settings(*models: str) -> Settings:
        key = ApiKeyConfig(id="new", hash=hash_key(generate_key()), models=models)
        return Settings(auth=AuthConfig(keys=(key,)), models=(StaticEngineConfig(name="m"),))

    control = AccessControl(settings("m"))
    with capture_logs() as logs:
        assert control.reload_keys(lambda: settings("n"))
    (warning,) = [e for e in logs if e["log_level"] == "warning"]
    assert "auth.keys[0] (new)" in warning["warning"] and "'n' matches no configured model" in warning["warning"]
