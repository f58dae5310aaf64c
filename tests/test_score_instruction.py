"""vLLM's /score takes the instruction of an LLM reranker (Qwen3) the ways vLLM documents --
the request's ``instruction``, or ``chat_template_kwargs`` ``{"instruction"}`` / ``{"instruct"}``
(the Qwen3 score template's two variables) -- and the gateway's ``instruct`` alias, as /rerank
does. None of them may be dropped silently: each changes the scores exactly as /rerank's
``instruction`` does. TEI's body has no instruction (TEI has none): the field is ignored, as
docs/dialects.md says for fields TEI does not have."""

from __future__ import annotations

import pytest

from tests.test_dialects import DOCS, Q, client, cohere_scores, ok, vllm_error  # noqa: F401 (fixture)

INSTRUCTION = "Find the passage that names a state capital"


def _scores(client, path: str, **extra) -> list[float]:
    body = ok(client.post(path, json={"model": "tiny", "text_1": Q, "text_2": DOCS, **extra}))
    return [d["score"] for d in body["data"]]


@pytest.mark.parametrize("path", ["/score", "/v1/score"])
@pytest.mark.parametrize(
    "extra",
    [
        {"instruction": INSTRUCTION},
        {"instruct": INSTRUCTION},
        {"chat_template_kwargs": {"instruction": INSTRUCTION}},
        {"chat_template_kwargs": {"instruct": INSTRUCTION, "enable_thinking": False}},
    ],
    ids=["instruction", "instruct", "kwargs-instruction", "kwargs-instruct"],
)
def test_score_honours_the_instruction_as_rerank_does(client, path, extra):
    expected = cohere_scores(client, Q, DOCS, instruction=INSTRUCTION)
    assert expected != pytest.approx(cohere_scores(client, Q, DOCS), abs=1e-6)  # the instruction matters
    assert _scores(client, path, **extra) == pytest.approx(expected, abs=1e-6)


def test_the_request_field_wins_over_chat_template_kwargs(client):
    expected = cohere_scores(client, Q, DOCS, instruction=INSTRUCTION)
    both = {"instruction": INSTRUCTION, "chat_template_kwargs": {"instruction": "Something else entirely"}}
    assert _scores(client, "/score", **both) == pytest.approx(expected, abs=1e-6)


def test_a_chat_template_instruction_that_is_not_a_string_is_a_400(client):
    resp = client.post("/score", json={"text_1": Q, "text_2": DOCS, "chat_template_kwargs": {"instruction": 3}})
    assert "instruction" in vllm_error(resp, 400, "BadRequestError")


def test_tei_body_has_no_instruction_and_ignores_one(client):
    plain = ok(client.post("/rerank", json={"query": Q, "texts": DOCS}))
    sent = ok(client.post("/rerank", json={"query": Q, "texts": DOCS, "instruction": INSTRUCTION}))
    assert sent == plain
