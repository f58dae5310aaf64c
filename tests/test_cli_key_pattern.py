"""Key ids and hashes with a trailing newline slipped past the config patterns.

``^...$`` in Python's ``re`` also matches before a final ``\\n``, so ``id = "ops\\n"`` and
``hash = "sha256:<hex>\\n"`` were accepted. The newline made them differ as strings from
``ops`` / ``sha256:<hex>``: KeyStore's "id used twice" and "same hash as another key" checks
(which guard a reload too) let a repeated key through, and a newline reached log lines and
metric labels as part of the id (RERANK_API_KEY_ID from a ConfigMap file keeps its newline).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config.settings import ConfigError, load_settings
from gateway.security.auth import generate_key, hash_key

KEY = generate_key()


def _config(tmp_path: Path, entries: str) -> Path:
    path = tmp_path / "gateway.toml"
    path.write_text('[[models]]\nname = "m"\nengine = "static"\n' + entries)
    return path


def test_same_hash_with_a_trailing_newline_is_refused(tmp_path: Path) -> None:
    h = hash_key(KEY)
    entries = (
        f'[[auth.keys]]\nid = "a"\nhash = "{h}"\nmodels = ["m"]\n'
        f'[[auth.keys]]\nid = "b"\nhash = "{h}\\n"\nmodels = ["*"]\n'
    )
    with pytest.raises(ConfigError):
        from gateway.http.access import AccessControl

        AccessControl(load_settings(_config(tmp_path, entries), environ={}))


def test_key_id_with_a_trailing_newline_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="RERANK_API_KEY_ID|auth.keys"):
        load_settings(_config(tmp_path, ""), environ={"RERANK_API_KEY": KEY, "RERANK_API_KEY_ID": "ops\n"})
