"""A failed inference in the CPU engines (OpenVINO's infer, the transformers forward pass) is the
engine failing (502, the Cohere error body, no library text), as a failed step of the packed
engine is, not an unexpected 500; the next request is served."""

from __future__ import annotations

import time

import pytest
from litestar.testing import TestClient

pytest.importorskip("openvino")

from gateway.app import create_app
from schemas.config import OpenVinoEngineConfig, Settings, TransformersEngineConfig
from tests.corpus import DOCS, Q
from tests.tiny_encoders import build_tiny_cross_encoder


def _fail_once_then_serve(model, patch_target, name, monkeypatch) -> None:
    app = create_app(Settings(models=(model,)), configure_logs=False)
    with TestClient(app) as client:
        deadline = time.monotonic() + 120
        while client.get("/ready").status_code != 200:
            assert time.monotonic() < deadline, client.get("/ready").text
            time.sleep(0.05)

        def broken(*args, **kwargs):
            raise RuntimeError("Exception from src/inference/src/infer_request.cpp:1: secret")

        with monkeypatch.context() as m:
            m.setattr(patch_target, name, broken)
            r = client.post("/v1/rerank", json={"model": "m", "query": Q, "documents": DOCS})
        assert r.status_code == 502, r.text
        assert r.json()["message"] == "the model's engine failed to score this request"
        assert "secret" not in r.text
        r = client.post("/v1/rerank", json={"model": "m", "query": Q, "documents": DOCS})
        assert r.status_code == 200, r.text
        assert len(r.json()["results"]) == len(DOCS)


def test_openvino_infer_failure_is_502_and_serving_goes_on(tmp_path, monkeypatch):
    import openvino as ov

    path = build_tiny_cross_encoder(tmp_path / "m")
    model = OpenVinoEngineConfig(name="m", path=str(path), cache_dir=str(tmp_path / "cache"), streams=1, threads=1)
    _fail_once_then_serve(model, ov.InferRequest, "infer", monkeypatch)


def test_transformers_forward_failure_is_502_and_serving_goes_on(tmp_path, monkeypatch):
    from adapters.families.encoder import EncoderFamily

    path = build_tiny_cross_encoder(tmp_path / "m")
    model = TransformersEngineConfig(name="m", path=str(path), device="cpu", dtype="float32")
    _fail_once_then_serve(model, EncoderFamily, "forward", monkeypatch)
