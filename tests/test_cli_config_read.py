"""Config files that exist but cannot be read, and empty environment values: one line, exit 2.

``load_settings`` caught only FileNotFoundError, so ``--config`` naming a directory or an
unreadable file ended ``check-config``/``serve`` in a traceback with exit 1. An empty
``RERANK_SERVER__PORT=`` was reported as "looks like JSON" (``""[:1] in "[{"`` is true).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway import cli
from gateway.config.settings import ConfigError, load_settings


def test_config_path_that_is_a_directory_is_one_line_exit_2(tmp_path: Path, capsys) -> None:
    code = cli.main(["check-config", "--config", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and str(tmp_path) in lines[0], err


def test_unreadable_config_is_a_config_error(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text('[[models]]\nname = "s"\nengine = "static"\n')

    def deny(self, *a, **k):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", deny)
    with pytest.raises(ConfigError, match="cannot read") as info:
        load_settings(path, environ={})
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("var", ["RERANK_SERVER__PORT", "RERANK_AUTH__OPEN"])
def test_empty_env_value_is_not_called_json(var: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(None, environ={var: ""})
    message = str(info.value)
    assert var in message and "JSON" not in message, message
