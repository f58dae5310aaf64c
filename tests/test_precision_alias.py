"""One name for one concept: ``precision`` ("fp32" / "bf16" / "fp16", the openvino and packed
spelling) is accepted on the engines whose own key is ``dtype`` and means that dtype; a
contradiction, or a precision the engine has no such dtype for, is refused at load naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config.settings import ConfigError, load_settings


def _load(tmp_path: Path, entry: str):
    config = tmp_path / "rerank.toml"
    config.write_text(f'[[models]]\nname = "m"\npath = "{tmp_path}"\n{entry}\n')
    return load_settings(config, environ={}).models[0]


@pytest.mark.parametrize(
    ("engine", "precision", "dtype"),
    [
        ("transformers", "bf16", "bfloat16"),
        ("transformers", "fp16", "float16"),
        ("transformers", "fp32", "float32"),
        ("vllm-score", "bf16", "bfloat16"),
        ("packed", "bf16", "bfloat16"),
    ],
)
def test_precision_is_the_engines_dtype(tmp_path: Path, engine: str, precision: str, dtype: str):
    model = _load(tmp_path, f'engine = "{engine}"\nprecision = "{precision}"')
    assert model.dtype == dtype
    # Read once: the engine sees dtype alone (packed keeps "auto" for its own fp8 mode).
    assert model.precision in (None, "auto")


def test_packed_fp8_is_still_its_own_mode(tmp_path: Path):
    model = _load(tmp_path, 'engine = "packed"\nprecision = "fp8"\ndtype = "bfloat16"')
    assert (model.precision, model.dtype) == ("fp8", "bfloat16")


def test_precision_and_a_different_dtype_are_refused_in_one_line(tmp_path: Path):
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, 'engine = "transformers"\nprecision = "bf16"\ndtype = "float16"')
    message = str(err.value)
    assert "precision = 'bf16' is dtype = 'bfloat16', but dtype = 'float16' is set too" in message
    assert "models[0]" in message or "$.models[0]" in message


def test_a_precision_the_engine_lacks_names_the_key_and_its_values(tmp_path: Path):
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, 'engine = "transformers"\nprecision = "int8"')
    message = str(err.value)
    assert "precision" in message and "'bf16'" in message and "revision" not in message
