"""Upstreams: models scored by another server over HTTP (DashScope, the hosted rerank APIs in
``hosted/``, pools of vLLM/TEI/Infinity/Cohere).

They are text engines (``tokenizer = None``): the service hands them texts and they speak the
upstream's protocol. A new remote API goes here.
"""
