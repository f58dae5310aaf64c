"""TEI's ``truncate: false`` 413 names the length of the sequence the model would have read.

A cross-encoder reads the query and the document as one sequence (``[CLS] q [SEP] d [SEP]``); a
bi-encoder reads the document alone (``[CLS] d [SEP]``), whatever the query. The count in
"`inputs` must have less than W tokens. Given: N" is checked against the checkpoint's own
tokenizer (transformers), not the gateway's.
"""

from __future__ import annotations

import re

import pytest
from litestar.testing import TestClient
from transformers import AutoTokenizer

from gateway.app import create_app
from schemas.config import DialectsConfig, Settings, TransformersEngineConfig
from tests.loopback import wait_loaded
from tests.tiny_encoders import build_tiny_bi_encoder, build_tiny_cross_encoder

WINDOW = 64
DOC = "Washington, D.C. is the capital of the United States and a federal district. " * 8
SHORT_Q = "capital?"
LONG_Q = "What is the capital city of the United States of America, and where is it?"


@pytest.fixture(scope="module", params=["cross-encoder", "bi-encoder"])
def served(request, tmp_path_factory):
    base = tmp_path_factory.mktemp(request.param)
    path = build_tiny_bi_encoder(base) if request.param == "bi-encoder" else build_tiny_cross_encoder(base)
    model = TransformersEngineConfig(name="m", path=str(path), family=request.param, dtype="float32", max_length=WINDOW)
    settings = Settings(dialects=DialectsConfig(tei_model="m"), models=(model,))
    with TestClient(create_app(settings, configure_logs=False)) as client:
        wait_loaded(client, 60)
        yield request.param, AutoTokenizer.from_pretrained(path), client


@pytest.mark.parametrize("query", [SHORT_Q, LONG_Q])
def test_given_count_is_the_sequence_the_model_reads(served, query):
    family, tokenizer, client = served
    r = client.post("/rerank", json={"query": query, "texts": [DOC], "truncate": False})
    assert r.status_code == 413, r.text
    found = re.search(rf"`inputs` must have less than {WINDOW} tokens\. Given: (\d+)", r.json()["error"])
    assert found, r.text
    pair = tokenizer(query, DOC) if family == "cross-encoder" else tokenizer(DOC)
    assert int(found.group(1)) == len(pair["input_ids"])
