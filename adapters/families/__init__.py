"""Model families: how a (query, document) pair becomes tokens and a model output becomes a score.

A family knows its prompt or input layout and its score rule (Qwen3's yes/no prompt; a
cross-encoder's pair with one logit and an activation; a bi-encoder's two embeddings and a
cosine; Jina v3's listwise call). It knows nothing about where the model runs: that is a
runtime's job (``adapters.runtimes``). A new model kind goes here.
"""
