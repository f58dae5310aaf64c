"""The ``packed`` runtime: varlen steps without padding, continuous batching, several devices.

Qwen3: ``forward`` (one model replica, causal, last positions only). Cross-encoders (BERT,
ELECTRA, RoBERTa, XLM-R): ``encoder_forward`` (bidirectional, first positions only);
ModernBERT: ``modernbert_forward`` (RoPE, global / local attention); both on ``pair_replica``
(the step every encoder replica shares); ``encoder`` (their engine). Shared: ``varlen``
(attention over a packed step), ``kernels`` (the pointwise regions between the GEMMs),
``scheduler`` (one queue, one worker thread per device), ``engine`` (the Qwen3 engine and what
both engines share), ``build`` (``build_packed_engine``, which picks the engine by family;
``encoder_replicas`` picks the encoder replica by model_type). Imported through the registry only.
"""
