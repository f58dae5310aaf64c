"""The command line (issue 22): help for every option, --version, and check-config and serve
running one set of checks, so ``config OK`` never meets a ``serve`` that refuses."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from gateway import __version__, cli

STATIC = '[[models]]\nname = "s"\nengine = "static"\n'


def _parsers(
    parser: argparse.ArgumentParser, name: str = "rerank-gateway"
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from _parsers(sub, f"{name} {sub_name}")


def test_every_command_and_option_has_help():
    missing = []
    for name, parser in _parsers(cli.build_parser()):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                missing += [f"{name} {c.dest}" for c in action._choices_actions if not c.help]
            elif not action.help or action.help == argparse.SUPPRESS:
                missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}")
    assert not missing, f"without help: {missing}"


@pytest.mark.parametrize("command", [[], ["bench"], ["eval"], ["keys"], ["serve"], ["check-config"]])
def test_descriptions_are_written_for_people(command, capsys):
    with pytest.raises(SystemExit) as done:
        cli.main([*command, "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert "``" not in text and ":class:" not in text and "::" not in text, text
    assert len(text.split("\n\n", 2)[1]) > 40  # a description, not just the usage line


def test_version(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"rerank-gateway {__version__}"


@pytest.mark.parametrize("command", ["serve", "check-config"])
def test_help_names_the_environment_overrides(command, capsys):
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    text = capsys.readouterr().out
    for name in (
        "RERANK_CONFIG",
        "RERANK_SERVER__PORT",
        "RERANK_MODELS__0__PATH",
        "RERANK_API_KEY",
        "RERANK_API_KEY_FILE",
    ):
        assert name in text, name


@pytest.fixture
def no_server(monkeypatch):
    """serve must stop before it runs a server: these tests are about the checks."""

    def refuse(*_args, **_kwargs):
        raise AssertionError("serve started a server")

    monkeypatch.setattr("gateway.launch.servers.run_uvicorn", refuse)
    monkeypatch.setattr("gateway.launch.servers.run_granian", refuse)


@pytest.mark.parametrize(
    ("env", "args", "wanted"),
    [
        ({"RERANK_SERVER__HOST": "0.0.0.0"}, [], "refusing to serve on 0.0.0.0 without API keys"),
        ({}, ["--host", "0.0.0.0"], "refusing to serve on 0.0.0.0 without API keys"),
        ({"RERANK_CACHE__ENABLED": "true", "RERANK_CACHE__BACKEND": "redis"}, [], 'cache.backend = "redis" needs'),
        ({"RERANK_API_KEY": "k" * 20, "RERANK_API_KEY_ID": "dup"}, [], "id 'dup' is used twice"),
    ],
)
def test_check_config_refuses_what_serve_refuses(tmp_path, monkeypatch, capsys, no_server, env, args, wanted):
    config = tmp_path / "g.toml"
    text = STATIC
    if "RERANK_API_KEY_ID" in env:  # a key in the file with the id the environment's key takes
        text += f'[[auth.keys]]\nid = "dup"\nhash = "sha256:{"1" * 64}"\nmodels = ["*"]\n'
    config.write_text(text)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert cli.main(["check-config", "--config", str(config), *args]) == 2
    checked = capsys.readouterr()
    assert wanted in checked.err and "config OK" not in checked.out
    assert cli.main(["serve", "--config", str(config), *args]) == 2
    served = capsys.readouterr().err.strip()
    assert wanted in served and len(served.splitlines()) == 1
    # The same line, plus check-config's note on what serve does with it.
    assert f"{served} [serve refuses to start]" in checked.err


def test_check_config_fails_for_a_local_path_that_does_not_exist(tmp_path, capsys):
    config = tmp_path / "g.toml"
    config.write_text('[[models]]\nname = "m"\nengine = "transformers"\npath = "/nonexistent/Qwen3-Reranker"\n')
    assert cli.main(["check-config", "--config", str(config)]) == 2
    (line,) = [x for x in capsys.readouterr().err.splitlines() if "models[0].path" in x]  # one line each
    assert "models[0].path (env RERANK_MODELS__0__PATH): '/nonexistent/Qwen3-Reranker' does not exist" in line
    assert line.endswith("[serve starts without this model]")
    # A hub id cannot be checked without the network: it is decided when the model loads.
    config.write_text('[[models]]\nname = "m"\nengine = "transformers"\npath = "Qwen/Qwen3-Reranker-0.6B"\n')
    if cli.main(["check-config", "--config", str(config)]) == 0:  # 2 only where transformers is missing
        assert "config OK" in capsys.readouterr().out


def test_check_config_and_serve_refuse_a_file_where_a_checkpoint_directory_belongs(tmp_path, capsys, no_server):
    file = tmp_path / "model.gguf"
    file.write_bytes(b"GGUF")
    config = tmp_path / "g.toml"
    config.write_text(f'[[models]]\nname = "m"\nengine = "transformers"\npath = "{file}"\n')
    for command in ("check-config", "serve"):
        assert cli.main([command, "--config", str(config)]) == 2
        assert f"models[0].path (env RERANK_MODELS__0__PATH): '{file}' is a file" in capsys.readouterr().err


@pytest.mark.parametrize("engine", ['engine = "packed"\nprecision = "fp8"', 'engine = "openvino"\nprecision = "int8"'])
def test_check_config_reads_a_parity_set_as_the_gate_will(tmp_path, capsys, engine):
    golden = tmp_path / "golden.jsonl"
    config = tmp_path / "g.toml"
    config.write_text(f'[[models]]\nname = "m"\n{engine}\npath = "/nonexistent/model"\nparity_set = "{golden}"\n')
    assert cli.main(["check-config", "--config", str(config)]) == 2
    (line,) = [x for x in capsys.readouterr().err.splitlines() if "parity_set" in x]
    assert line.startswith(
        f"rerank-gateway: models[0].parity_set (env RERANK_MODELS__0__PARITY_SET): {golden}: cannot be read"
    )
    assert line.endswith("[serve starts without this model]")
    golden.write_text('{"query": "q", "documents": ["a", "b"]}\n')
    assert cli.main(["check-config", "--config", str(config)]) == 2
    (line,) = [x for x in capsys.readouterr().err.splitlines() if "parity_set" in x]
    assert f"{golden}:1: 2 documents; the gate compares top-10, so give at least 10" in line
    golden.write_text('{"query": "q", "documents": ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"]}\n')
    cli.main(["check-config", "--config", str(config)])  # still 2: the path does not exist
    assert "parity_set" not in capsys.readouterr().err


@pytest.mark.parametrize(("engine", "precision"), [("packed", "auto"), ("openvino", "fp32")])
def test_a_parity_set_without_a_reduced_precision_is_refused(tmp_path, capsys, engine, precision):
    config = tmp_path / "g.toml"
    config.write_text(
        f'[[models]]\nname = "m"\nengine = "{engine}"\nprecision = "{precision}"\npath = "/m"\n'
        f'parity_set = "{tmp_path}/golden.jsonl"\n'
    )
    assert cli.main(["check-config", "--config", str(config)]) == 2
    assert "read only with precision" in capsys.readouterr().err
