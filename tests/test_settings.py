"""Config loading: TOML, RERANK_* overrides, defaults, and one clear line for every mistake."""

from __future__ import annotations

import pytest

from gateway.config import settings as settings_module
from gateway.config.settings import ConfigError, cuda_present, default_engine_kind, load_settings
from schemas.config import DEFAULT_MODEL_NAME, DEFAULT_MODEL_PATH, StaticEngineConfig, TransformersEngineConfig

TOML = """
[server]
port = 9001

[limits]
max_documents = 500

[[models]]
name = "a"
engine = "static"
score = 0.25

[[models]]
name = "b"
engine = "transformers"
path = "/models/qwen"
aliases = ["rerank-v3.5"]
"""


def test_toml_decodes_into_the_tagged_union(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(TOML)
    s = load_settings(path, environ={})
    assert s.server.port == 9001 and s.server.host == "127.0.0.1" and s.limits.max_documents == 500
    assert isinstance(s.models[0], StaticEngineConfig) and s.models[0].score == 0.25
    assert isinstance(s.models[1], TransformersEngineConfig) and s.models[1].aliases == ("rerank-v3.5",)
    assert s.models[1].max_length == 8192 and s.models[1].dtype == "auto"


def test_env_overrides_file_and_coerces_types(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(TOML)
    env = {
        "RERANK_CONFIG": str(path),
        "RERANK_SERVER__PORT": "9100",
        "RERANK_LOGGING__FORMAT": "console",
        "RERANK_MODELS__1__PATH": "/elsewhere",
        "RERANK_MODELS__1__ALIASES": '["x", "y"]',
        "RERANK_MODELS__0__SCORE": "0.75",
        "OTHER": "ignored",
    }
    s = load_settings(environ=env)
    assert s.server.port == 9100 and s.logging.format == "console"
    assert s.models[1].path == "/elsewhere" and s.models[1].aliases == ("x", "y")
    assert s.models[0].score == 0.75


def test_defaults_serve_qwen3_reranker():
    s = load_settings(environ={})
    (model,) = s.models
    assert model.name == DEFAULT_MODEL_NAME and model.path == DEFAULT_MODEL_PATH
    s = load_settings(environ={"RERANK_MODELS__0__PATH": "/local/qwen"})
    assert s.models[0].path == "/local/qwen"


def test_default_engine_is_packed_on_cuda(monkeypatch):
    # Issue 24: packed beat vllm-score on every figure measured on an H200, so a GPU defaults to it;
    # without one the order stays vllm-score (when installed), then transformers.
    monkeypatch.setattr(settings_module, "_engine_registered", lambda kind: True)
    present = {"transformers", "vllm"}
    monkeypatch.setattr(settings_module.importlib.util, "find_spec", lambda name: object() if name in present else None)
    assert default_engine_kind(cuda=True) == "packed"
    assert default_engine_kind(cuda=False) == "vllm-score"
    present.discard("vllm")
    assert default_engine_kind(cuda=False) == "transformers"
    present.clear()  # nothing installed on a GPU machine: transformers' missing-extra hint, not packed
    assert default_engine_kind(cuda=True) == "transformers"
    monkeypatch.setattr(settings_module, "cuda_present", lambda: True)
    present.update({"transformers", "vllm"})
    assert load_settings(environ={}).models[0].__struct_config__.tag == "packed"


def test_cuda_present_reads_device_nodes_not_torch(tmp_path):
    assert not cuda_present({}, str(tmp_path))
    (tmp_path / "nvidiactl").touch()  # the control node alone is no GPU
    assert not cuda_present({}, str(tmp_path))
    (tmp_path / "nvidia0").touch()
    assert cuda_present({}, str(tmp_path))
    assert cuda_present({"CUDA_VISIBLE_DEVICES": "0"}, str(tmp_path))
    assert not cuda_present({"CUDA_VISIBLE_DEVICES": ""}, str(tmp_path))
    assert not cuda_present({"CUDA_VISIBLE_DEVICES": "-1"}, str(tmp_path))
    assert not cuda_present({}, str(tmp_path / "missing"))


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('[server]\nport = "x"', "server.port"),
        ("[server]\nprot = 1", "prot"),
        ('[[models]]\nname = "a"\nengine = "nope"', "nope"),
        ('[[models]]\nname = "a"\nengine = "static"\nscore = 2', "models[0].score: must be at most 1"),
        ('[[models]]\nname = "a b"\nengine = "static"', "models[0].name"),
        ('[[models]]\nname = "a"\nengine = "static"\n[[models]]\nname = "a"\nengine = "static"', "used twice"),
        ("[server\n", "not valid TOML"),
    ],
)
def test_bad_config_fails_with_one_line_naming_the_field(tmp_path, text, needle):
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_settings(path, environ={})
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_bad_env_override_is_reported(tmp_path):
    with pytest.raises(ConfigError, match="RERANK_MODELS__5__PATH"):
        load_settings(environ={"RERANK_MODELS__5__PATH": "/x"})
    with pytest.raises(ConfigError, match="missing.toml"):
        load_settings(tmp_path / "missing.toml", environ={})


def test_shipped_example_config_is_valid():
    from tests.conftest import ROOT

    s = load_settings(ROOT / "deploy" / "gateway.example.toml", environ={})
    assert s.models[0].name == "qwen3-reranker-0.6b"


# -- issue 22: typed like the request path, errors in words -----------------------------------
STATIC = '[[models]]\nname = "a"\nengine = "static"\n'


@pytest.mark.parametrize("line", ['port = "8001"', 'workers = "2"', 'shutdown_timeout_s = "5"'])
def test_a_quoted_number_in_the_file_is_refused(tmp_path, line):
    path = tmp_path / "c.toml"
    path.write_text(f"[server]\n{line}\n{STATIC}")
    with pytest.raises(ConfigError) as err:
        load_settings(path, environ={})
    field, value = line.split(" = ")
    assert f"server.{field}: expected " in str(err.value) and f"the string '{value.strip(chr(34))}'" in str(err.value)
    assert "without quotes" in str(err.value)


def test_environment_values_are_converted_to_the_field_type(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(STATIC)
    s = load_settings(
        path,
        environ={
            "RERANK_SERVER__PORT": "8001",
            "RERANK_SERVER__WORKERS": "2",
            "RERANK_SERVER__SHUTDOWN_TIMEOUT_S": "5",
            "RERANK_AUTH__OPEN": "true",
            "RERANK_MODELS__0__SCORES": '{"doc": 0.5}',
        },
    )
    assert (s.server.port, s.server.workers, s.server.shutdown_timeout_s, s.auth.open) == (8001, 2, 5.0, True)
    assert s.models[0].scores == {"doc": 0.5}
    # A string field keeps its text, even text that looks like JSON.
    path.write_text('[[models]]\nname = "a"\nengine = "transformers"\npath = "/m"\n')
    s = load_settings(path, environ={"RERANK_MODELS__0__INSTRUCTION": "[INST] rank {these}"})
    assert s.models[0].instruction == "[INST] rank {these}"


@pytest.mark.parametrize(
    ("text", "wanted"),
    [
        (
            '[[models]]\nname = "a"\nengine = "transfomers"\npath = "/m"\n',
            (
                "models[0].engine: unknown engine 'transfomers'; the engines are 'bedrock', 'cascade', 'chain', 'cohere', 'dashscope', 'gguf', 'jina', "
                "'mixedbread', 'nvidia', 'openvino', 'packed', 'pool', 'static', 'together', 'transformers', 'vllm-generate', "
                "'vllm-score', 'voyage'"
            ),
        ),
        (
            f'[logging]\nlevel = "VERBOSE"\n{STATIC}',
            "logging.level: invalid value 'VERBOSE'; allowed: 'DEBUG', 'ERROR', 'INFO', 'WARNING'",
        ),
        (
            '[[models]]\nname = "my model"\nengine = "static"\n',
            "models[0].name: must be a name without spaces, tabs or line breaks",
        ),
        # A regex `$` matches before a final line break: the name must end where the text ends.
        (
            '[[models]]\nname = "static\\n"\nengine = "static"\n',
            "models[0].name: must be a name without spaces, tabs or line breaks",
        ),
        (
            '[[models]]\nname = "a"\naliases = ["rerank-v3.5\\n"]\nengine = "static"\n',
            "models[0].aliases[0]: must be a name without spaces, tabs or line breaks",
        ),
        (f'[dialects]\ntei_model = "a\\n"\n{STATIC}', "dialects.tei_model: must be a name without spaces"),
        (
            f'[[auth.keys]]\nid = "a b"\nhash = "sha256:{"0" * 64}"\nmodels = ["*"]\n{STATIC}',
            "auth.keys[0].id: must be 1-64 letters, digits",
        ),
        (f"[server]\nprot = 1\n{STATIC}", "server has no field 'prot' (did you mean 'port'?)"),
    ],
)
def test_errors_say_what_is_allowed_in_words(tmp_path, text, wanted):
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_settings(path, environ={})
    message = str(err.value)
    assert wanted in message and "\n" not in message
    assert "regex" not in message and "Invalid enum" not in message


@pytest.mark.parametrize(
    ("env", "wanted"),
    [
        ({"RERANK_MODELS__0__PAHT": "/models/q"}, "models[0] has no field 'paht' (did you mean 'path'?)"),
        ({"RERANK_SERVER__PORT": "eighty"}, "server.port: expected an integer, got 'eighty'"),
        ({"RERANK_SERVER__PORT": "70000"}, "server.port: must be at most 65535"),
        ({"RERANK_MODELS__0__NAME": "qwen3\n"}, "models[0].name: must be a name without spaces"),
        ({"RERANK_LOGGING__LEVEL": "VERBOSE"}, "allowed: 'DEBUG', 'ERROR', 'INFO', 'WARNING'"),
        ({"RERANK_MODELS__0__ENGINE": "transfomers"}, "unknown engine 'transfomers'"),
        ({"RERANK_SERVER": '{"port": "x"}'}, "server.port: expected an integer"),
        # The default model has a path; the engine the variable picks has none.
        ({"RERANK_MODELS__0__ENGINE": "static"}, "models[0] has no field 'path'"),
    ],
)
def test_an_environment_mistake_names_its_variable(env, wanted):
    with pytest.raises(ConfigError) as err:
        load_settings(environ=env)
    (var,) = env
    message = str(err.value)
    assert message.startswith(f"invalid config ({var}): ") and wanted in message, message
    assert "defaults" not in message
