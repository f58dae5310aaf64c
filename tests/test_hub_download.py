"""A hub checkpoint for the OpenVINO runtime is fetched with only what the gateway reads: config,
tokenizer and sentence-transformers files, and the top-level weights in one format (safetensors
when the repo has them, else .bin) -- not onnx/, openvino/ or a second copy of the weights.
No network: huggingface_hub's listing and snapshot_download are replaced, and the patterns the
gateway passes are applied to the listing with huggingface_hub's own filter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import huggingface_hub
import pytest
from huggingface_hub.utils import filter_repo_objects

from adapters.runtimes.cpu import export

SMALL = [
    ".gitattributes",
    "README.md",
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "sentencepiece.bpe.model",
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
    "1_Pooling/config.json",
]
HEAVY = [
    "onnx/model.onnx",
    "onnx/model_quantized.onnx",
    "openvino/openvino_model.xml",
    "openvino/openvino_model.bin",
    "openvino/openvino_model_qint8_quantized.bin",
    "tf_model.h5",
    "flax_model.msgpack",
]
WANTED_SMALL = {f for f in SMALL if f not in (".gitattributes", "README.md")}


def _fetch(monkeypatch, tmp_path: Path, listing: list[str] | Exception) -> set[str]:
    calls: list[dict[str, Any]] = []

    def list_repo_files(self: Any, repo_id: str, *, revision: str | None = None, **kw: Any) -> list[str]:
        assert repo_id == "org/model" and revision == "abc"
        if isinstance(listing, Exception):
            raise listing
        return list(listing)

    def snapshot_download(repo_id: str, **kw: Any) -> str:
        assert repo_id == "org/model" and kw.get("revision") == "abc"
        calls.append(kw)
        return str(tmp_path)

    monkeypatch.setattr(huggingface_hub.HfApi, "list_repo_files", list_repo_files)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    assert export.checkpoint_dir("org/model", "abc") == tmp_path
    (kw,) = calls
    assert kw.get("allow_patterns"), "the whole repository would be downloaded"
    files = listing if isinstance(listing, list) else [*SMALL, *HEAVY, "model.safetensors", "pytorch_model.bin"]
    return set(
        filter_repo_objects(files, allow_patterns=kw["allow_patterns"], ignore_patterns=kw.get("ignore_patterns"))
    )


def test_safetensors_only_when_the_repo_has_both_formats(monkeypatch, tmp_path):
    listing = [*SMALL, *HEAVY, "model.safetensors", "pytorch_model.bin"]
    assert _fetch(monkeypatch, tmp_path, listing) == WANTED_SMALL | {"model.safetensors"}


def test_sharded_safetensors_and_their_index(monkeypatch, tmp_path):
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    listing = [*SMALL, *HEAVY, *shards, "model.safetensors.index.json", "pytorch_model.bin"]
    assert _fetch(monkeypatch, tmp_path, listing) == WANTED_SMALL | {*shards, "model.safetensors.index.json"}


def test_bin_when_the_repo_has_no_safetensors(monkeypatch, tmp_path):
    listing = [*SMALL, *HEAVY, "pytorch_model.bin"]
    assert _fetch(monkeypatch, tmp_path, listing) == WANTED_SMALL | {"pytorch_model.bin"}


def test_without_a_listing_no_onnx_openvino_or_other_frameworks(monkeypatch, tmp_path):
    # Offline or the listing refused: the cached snapshot serves, and a download stays restricted.
    got = _fetch(monkeypatch, tmp_path, OSError("hub unreachable"))
    assert WANTED_SMALL <= got and "model.safetensors" in got
    assert not got & set(HEAVY)


def test_a_local_directory_is_used_as_it_is(monkeypatch, tmp_path):
    def no_network(*a: Any, **kw: Any) -> None:
        pytest.fail("a local checkpoint must not touch the hub")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_network)
    assert export.checkpoint_dir(str(tmp_path), None) == tmp_path
