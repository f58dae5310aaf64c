"""Many models in one config all load on their first attempt.

The models load at once in worker threads. transformers' top-level names are lazy (a module
``__getattr__`` that imports the submodule on first use), and threads racing through that first
import used to fail a load with ``ImportError: cannot import name 'AutoTokenizer' from
'transformers'`` (retried 5 s later). The race needs a process where transformers has not been
imported yet, so the loads run in a fresh interpreter; the checkpoints are built here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tiny_encoders import build_tiny_bi_encoder, build_tiny_cross_encoder
from tests.tiny_qwen3 import build_tiny_qwen3

pytestmark = pytest.mark.slow

# Loads the config's models the way the gateway does (ModelRegistry.start: one task each, all at
# once) and prints each model's attempts and error.
_SCRIPT = r"""
import asyncio, json, sys
import msgspec
from gateway.serving.models import ModelRegistry
from schemas.config import Settings

assert "transformers" not in sys.modules, "the race needs transformers not yet imported"
settings = msgspec.convert(json.loads(sys.argv[1]), Settings)

async def main():
    registry = ModelRegistry(settings)
    registry.start()
    try:
        await asyncio.wait_for(registry.wait_loaded(), timeout=float(sys.argv[2]))
    except TimeoutError:
        pass
    out = {rt.name: [rt.load_attempts, rt.state.value, rt.error] for rt in registry}
    await registry.stop()
    print(json.dumps(out))

asyncio.run(main())
"""


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    base = tmp_path_factory.mktemp("parallel")
    return [
        build_tiny_cross_encoder(base / "bert-ce"),
        build_tiny_cross_encoder(base / "xlmr-ce", kind="xlmr"),
        build_tiny_bi_encoder(base / "bert-bi"),
        build_tiny_qwen3(base / "qwen3"),
    ]


def test_ten_models_load_on_their_first_attempt(checkpoints):
    # Every family on transformers (Qwen3 twice), and Qwen3 on the packed runtime (the pair seen
    # racing on the GPU machine).
    models = [
        {
            "name": f"m{i}",
            "engine": "transformers",
            "path": str(checkpoints[i % len(checkpoints)]),
            "device": "cpu",
            "dtype": "float32",
            "max_length": 512,
            "max_query_tokens": 64,
        }
        for i in range(9)
    ]
    models.append(
        {
            "name": "packed",
            "engine": "packed",
            "path": str(checkpoints[3]),
            "devices": ["cpu"],
            "dtype": "float32",
            "max_length": 512,
            "max_query_tokens": 64,
        }
    )
    # A retry would come 60 s later: the wait below ends long before, so a failed first attempt shows.
    settings = {"models": models, "server": {"load_retry_initial_s": 60}}
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, json.dumps(settings), "50"],
        check=False,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=180,
        env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(root)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    failed = {name: r for name, r in result.items() if r[:2] != [1, "ready"]}
    assert not failed, failed
