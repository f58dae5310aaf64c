"""An empty RERANK_API_KEY_FILE must not silently mean "no key".

``_add_env_key`` read the file, stripped it and returned quietly when nothing was left: a
mounted secret that is empty (or caught mid-rewrite on a SIGHUP reload) turned the gateway
open on loopback, and on reload dropped the env key while the config's other keys kept the
exposure check happy, so every client of that key got 401.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config.settings import ConfigError, load_settings
from gateway.http.access import AccessControl
from gateway.security.auth import generate_key, hash_key

ENV_KEY, CONFIG_KEY = generate_key(), generate_key()


def test_empty_key_file_is_an_error(tmp_path: Path) -> None:
    key_file = tmp_path / "api-key"
    key_file.write_text("\n")
    with pytest.raises(ConfigError, match="RERANK_API_KEY_FILE"):
        load_settings(None, environ={"RERANK_API_KEY_FILE": str(key_file)})


def test_reload_with_an_emptied_key_file_keeps_the_env_key(tmp_path: Path) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text(
        '[server]\nhost = "0.0.0.0"\n[[models]]\nname = "m"\nengine = "static"\n'
        f'[[auth.keys]]\nid = "cfg"\nhash = "{hash_key(CONFIG_KEY)}"\nmodels = ["*"]\n'
    )
    key_file = tmp_path / "api-key"
    key_file.write_text(ENV_KEY + "\n")
    environ = {"RERANK_API_KEY_FILE": str(key_file)}
    control = AccessControl(load_settings(config, environ=environ))
    header = [(b"authorization", f"Bearer {ENV_KEY}".encode())]
    assert control.keys.authenticate(header).id == "env"
    key_file.write_text("")  # truncated by a writer that has not written the new key yet
    assert control.reload_keys(lambda: load_settings(config, environ=environ)) is False
    assert control.keys.authenticate(header).id == "env"
