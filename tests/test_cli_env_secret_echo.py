"""A config error must not echo an environment value that may be an API key.

An operator who puts the key into ``RERANK_AUTH__KEYS`` (or ``RERANK_AUTH``) instead of
``RERANK_API_KEY`` got ``auth.keys: expected an array, got 'rk-...'``: the key in the one-line
error that goes to the container log (and, on a SIGHUP reload, into ``keys_reload_rejected``).
Short values (typos such as ``eighty``) are still quoted; anything as long as a key is not.
"""

from __future__ import annotations

import pytest

from gateway.config.settings import ConfigError, load_settings
from gateway.security.auth import generate_key

KEY = generate_key()


@pytest.mark.parametrize("var", ["RERANK_AUTH__KEYS", "RERANK_AUTH", "RERANK_SERVER__PORT", "RERANK_AUTH__KEYS__0"])
def test_a_key_in_the_wrong_variable_is_not_echoed(var: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(None, environ={var: KEY})
    message = str(info.value)
    assert var in message and KEY not in message and KEY[:16] not in message, message


def test_short_typos_are_still_quoted() -> None:
    with pytest.raises(ConfigError, match="expected an integer, got 'eighty'"):
        load_settings(None, environ={"RERANK_SERVER__PORT": "eighty"})
