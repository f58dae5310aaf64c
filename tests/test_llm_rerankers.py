"""bge-reranker-v2-gemma and mxbai-rerank-v2 on the transformers runtime, against their cards.

Tiny random checkpoints of the real architectures (``tests.tiny_llm_rerankers``: GemmaForCausalLM,
Qwen2ForCausalLM with tokenizers shaped like theirs) served by the gateway in-process, every
score checked against ``tests.llm_card_reference`` (the cards' own prompt tokenization and
formula, a full forward per prompt) within 1e-5 in fp32. vLLM's side is test_vllm_llm_rerankers.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from litestar.testing import TestClient

from adapters.families.detect import detect_family, read_model_files
from adapters.families.llm import LlmPromptTokenizer, load_hf_tokenizer
from gateway.app import create_app
from schemas.config import LLM_RERANKERS, PackedEngineConfig, ServerConfig, Settings, TransformersEngineConfig
from tests import llm_card_reference as card
from tests.loopback import wait_loaded

Q = "What is the capital of the United States?"
DOCS = [
    "Carson City is the capital city of the American state of Nevada.",
    "Washington, D.C. is the capital of the United States. It is a federal district.",
    "Capital punishment has existed in the United States since before it was a country.",
    "Quantum computing uses qubits.",
    "Yes",
    # Piece boundaries: leading punctuation, leading / trailing spaces, a newline.
    "(see above) the capital is Paris.",
    "  two leading spaces and a trailing one ",
    "line one\nline two",
]
TOL = 1e-5
COMMON: dict = {"device": "cpu", "dtype": "float32", "max_length": 512, "max_query_tokens": 64}


@pytest.fixture(scope="module")
def client(tiny_gemma_dir: Path, tiny_qwen2_dir: Path) -> Iterator[TestClient]:
    # family = "auto": the checkpoints' architectures pick the families.
    settings = Settings(
        models=(
            TransformersEngineConfig(name="gemma", path=str(tiny_gemma_dir), **COMMON),
            TransformersEngineConfig(name="mxbai", path=str(tiny_qwen2_dir), **COMMON),
            # A configured default instruction replaces the family's.
            TransformersEngineConfig(
                name="mxbai-instr", path=str(tiny_qwen2_dir), instruction="Find the capital", **COMMON
            ),
        )
    )
    with TestClient(create_app(settings, configure_logs=False)) as c:
        deadline = time.monotonic() + 120
        while c.get("/ready").status_code != 200:
            assert time.monotonic() < deadline, c.get("/ready").json()
            time.sleep(0.05)
        yield c


def _scores(client: TestClient, model: str, documents: list[str], **extra: object) -> list[float]:
    resp = client.post("/v2/rerank", json={"model": model, "query": Q, "documents": documents, **extra})
    assert resp.status_code == 200, resp.text
    by_index = {r["index"]: r["relevance_score"] for r in resp.json()["results"]}
    return [by_index[i] for i in range(len(documents))]


def _prompt(model_dir: Path, family: str) -> LlmPromptTokenizer:
    tokenizer = load_hf_tokenizer(str(model_dir))
    return LlmPromptTokenizer(tokenizer, LLM_RERANKERS[family], max_length=512, max_query_tokens=64)


# -- prompts -----------------------------------------------------------------------------------
@pytest.mark.parametrize("instruction", [None, "Does the passage name a capital city?"])
def test_gemma_prompt_tokens_equal_the_cards(tiny_gemma_dir, instruction):
    prompt = _prompt(tiny_gemma_dir, "bge-reranker-v2-gemma")
    used = instruction or prompt.default_instruction
    shared = prompt.encode_shared(Q, used)
    for doc, ids in zip(DOCS, prompt.encode_documents(DOCS), strict=True):
        expected = card.gemma_ids(tiny_gemma_dir, Q, doc, *([instruction] if instruction else []))
        assert prompt.assemble(shared, ids, used) == expected, doc
    # The prompt after the passage counts against the window with the rest of what a request shares.
    assert prompt.suffix_length == 0 and prompt.item_room(shared) == 512 - len(shared)


@pytest.mark.parametrize("instruction", ["", "Find the capital"])
def test_mxbai_prompt_tokens_equal_the_cards(tiny_qwen2_dir, instruction):
    prompt = _prompt(tiny_qwen2_dir, "mxbai-rerank-v2")
    shared = prompt.encode_shared(Q, instruction)
    for doc, ids in zip(DOCS, prompt.encode_documents(DOCS), strict=True):
        assert prompt.assemble(shared, ids) == card.mxbai_ids(tiny_qwen2_dir, Q, doc, instruction or None), doc
    assert prompt.default_instruction == ""  # the card's instruction is optional, and off by default


def test_score_tokens_are_the_cards(tiny_gemma_dir, tiny_qwen2_dir):
    gemma, mxbai = _prompt(tiny_gemma_dir, "bge-reranker-v2-gemma"), _prompt(tiny_qwen2_dir, "mxbai-rerank-v2")
    gemma_tok, mxbai_tok = load_hf_tokenizer(str(tiny_gemma_dir)), load_hf_tokenizer(str(tiny_qwen2_dir))
    assert gemma.score_token_ids == [gemma_tok.convert_tokens_to_ids("Yes")]
    assert mxbai.score_token_ids == [mxbai_tok.convert_tokens_to_ids("0"), mxbai_tok.convert_tokens_to_ids("1")]


def test_a_job_whose_shared_part_lacks_its_instruction_tail_is_refused(tiny_gemma_dir):
    from adapters.base import EngineError

    prompt = _prompt(tiny_gemma_dir, "bge-reranker-v2-gemma")
    shared = prompt.encode_shared(Q, "one instruction")
    with pytest.raises(EngineError, match="instruction's tail"):
        prompt.assemble(shared, [5], "another instruction")


# -- detection and runtimes ----------------------------------------------------------------------
def test_auto_detects_the_llm_rerankers(tiny_gemma_dir, tiny_qwen2_dir):
    gemma = detect_family(read_model_files(str(tiny_gemma_dir)))
    mxbai = detect_family(read_model_files(str(tiny_qwen2_dir)))
    assert (gemma.family, mxbai.family) == ("bge-reranker-v2-gemma", "mxbai-rerank-v2")
    assert "GemmaForCausalLM" in gemma.reason and "Qwen2ForCausalLM" in mxbai.reason


@pytest.mark.parametrize("family", ["bge-reranker-v2-gemma", "mxbai-rerank-v2"])
def test_packed_is_refused_in_one_line_saying_why(family):
    with pytest.raises(ValueError, match=r"cannot run on engine 'packed' \(packed runs Qwen3's layer layout") as exc:
        PackedEngineConfig(name="m", path="x", family=family)
    assert "\n" not in str(exc.value)
    # The same from a config file.
    toml = f'[[models]]\nname = "m"\nengine = "packed"\npath = "x"\nfamily = "{family}"\n'
    with pytest.raises(msgspec.ValidationError, match="packed runs Qwen3's layer layout only"):
        msgspec.toml.decode(toml, type=Settings)


def test_packed_refuses_a_detected_gemma_at_start(tiny_gemma_dir):
    from adapters.families import resolve_for_runtime

    cfg = PackedEngineConfig(name="m", path=str(tiny_gemma_dir), devices=("cpu",))
    with pytest.raises(ValueError, match="bge-reranker-v2-gemma model .* cannot run \\(packed runs Qwen3's"):
        resolve_for_runtime(cfg, "packed")


def test_tied_embedding_models_load_together_on_the_first_attempt(tiny_gemma_dir, tiny_qwen2_dir):
    """transformers 5.19's from_pretrained races on tied embeddings (bge-reranker-v2-gemma and
    mxbai-rerank-v2 tie theirs): loaded in parallel threads, some failed with 'Cannot copy out of
    meta tensor; no data!'. Weights load one model at a time; a retry would come only after 300 s."""
    paths = [tiny_gemma_dir, tiny_qwen2_dir, tiny_qwen2_dir, tiny_gemma_dir]
    settings = Settings(
        server=ServerConfig(load_retry_initial_s=300),
        models=tuple(TransformersEngineConfig(name=f"m{i}", path=str(p), **COMMON) for i, p in enumerate(paths)),
    )
    with TestClient(create_app(settings, configure_logs=False)) as c:
        wait_loaded(c, 120)
        assert [m["state"] for m in c.get("/ready").json()["models"]] == ["ready"] * len(paths)


# -- scores through the gateway --------------------------------------------------------------------
def test_gemma_scores_equal_the_card_through_the_gateway(client, tiny_gemma_dir):
    assert _scores(client, "gemma", DOCS) == pytest.approx(card.gemma_scores(tiny_gemma_dir, Q, DOCS), abs=TOL)
    # The request's instruction is the card's `prompt` argument (after the passage).
    asked = "Is B about a capital?"
    assert _scores(client, "gemma", DOCS[:4], instruction=asked) == pytest.approx(
        card.gemma_scores(tiny_gemma_dir, Q, DOCS[:4], prompt=asked), abs=TOL
    )


def test_mxbai_scores_equal_the_card_through_the_gateway(client, tiny_qwen2_dir):
    ref = card.mxbai_scores(tiny_qwen2_dir, Q, DOCS)
    assert _scores(client, "mxbai", DOCS) == pytest.approx(ref, abs=TOL)
    # The documents really score differently (the long fixed task prompt after the document
    # keeps a random model's spread small: ~8e-4, still 80x the tolerance).
    assert max(ref) - min(ref) > 50 * TOL
    with_instr = card.mxbai_scores(tiny_qwen2_dir, Q, DOCS[:4], instruction="Find the capital")
    assert _scores(client, "mxbai", DOCS[:4], instruction="Find the capital") == pytest.approx(with_instr, abs=TOL)
    assert _scores(client, "mxbai-instr", DOCS[:4]) == pytest.approx(with_instr, abs=TOL)


@pytest.mark.parametrize("name", ["gemma", "mxbai"])
def test_raw_scores_are_the_cards_logits(client, tiny_gemma_dir, tiny_qwen2_dir, name):
    # vLLM's spelling of a raw request (use_activation: false); the cards' normalize=False output.
    resp = client.post("/score", json={"model": name, "text_1": Q, "text_2": DOCS, "use_activation": False})
    assert resp.status_code == 200, resp.text
    ref = card.gemma_logits(tiny_gemma_dir, Q, DOCS) if name == "gemma" else card.mxbai_logits(tiny_qwen2_dir, Q, DOCS)
    assert [d["score"] for d in resp.json()["data"]] == pytest.approx(ref, abs=1e-4)


def test_ready_reports_the_families(client):
    models = {m["name"]: m for m in client.get("/ready").json()["models"]}
    assert models["gemma"]["family"] == "bge-reranker-v2-gemma"
    assert models["mxbai"]["family"] == "mxbai-rerank-v2"


def test_a_label_the_tokenizer_merges_into_the_document_is_glued_to_it(tiny_gemma_dir):
    """With the cut after "B: " (the space on the label's side), Gemma-style tokenizers merge "▁"
    into the document's first word: tokenized apart, the ids would differ from the card's."""
    spec = msgspec.structs.replace(LLM_RERANKERS["bge-reranker-v2-gemma"], middle=("\n", "B: "), document="{document}")
    prompt = LlmPromptTokenizer(load_hf_tokenizer(str(tiny_gemma_dir)), spec, max_length=512, max_query_tokens=64)
    shared = prompt.encode_shared(Q, prompt.default_instruction)
    for doc, ids in zip(DOCS, prompt.encode_documents(DOCS), strict=True):
        assert prompt.assemble(shared, ids, prompt.default_instruction) == card.gemma_ids(tiny_gemma_dir, Q, doc), doc


def test_check_config_names_the_family_and_refuses_packed_for_a_detected_gemma(
    tiny_gemma_dir, tiny_qwen2_dir, tmp_path, capsys
):
    from gateway.cli import main

    good = tmp_path / "good.toml"
    good.write_text(
        f'[[models]]\nname = "g"\nengine = "vllm-score"\npath = "{tiny_gemma_dir}"\n'
        f'[[models]]\nname = "m"\nengine = "transformers"\npath = "{tiny_qwen2_dir}"\n'
    )
    assert main(["check-config", "--config", str(good)]) == 0
    out = capsys.readouterr().out
    assert "model g: engine=vllm-score family=bge-reranker-v2-gemma (config.json architectures has Gemma" in out
    assert "model m: engine=transformers family=mxbai-rerank-v2 (config.json architectures has Qwen2" in out

    bad = tmp_path / "bad.toml"
    bad.write_text(f'[[models]]\nname = "g"\nengine = "packed"\npath = "{tiny_gemma_dir}"\n')
    assert main(["check-config", "--config", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "models[0].engine: " in err, err
    assert "packed runs Qwen3's layer layout only" in err


def test_a_query_cut_inside_a_character_drops_the_partial_character(tiny_qwen2_dir):
    """max_query_tokens cuts in token space; byte-level BPE spells an emoji in several tokens, so
    a cut can fall inside one, whose decoded bytes are U+FFFD: that is no part of the query."""
    tok = load_hf_tokenizer(str(tiny_qwen2_dir))
    prompt = LlmPromptTokenizer(tok, LLM_RERANKERS["mxbai-rerank-v2"], max_length=512, max_query_tokens=8)
    texts = [
        tok.decode(prompt.encode_shared("ab " * k + "\U0001f600" * 8, prompt.default_instruction)) for k in range(4)
    ]
    assert all("\U0001f600" in t or "ab ab" in t for t in texts)  # the query was cut, not dropped
    assert not [t for t in texts if "\ufffd" in t], texts
