"""rerank-gateway: a Cohere/Jina-compatible rerank API over self-hosted and cloud rerankers."""

__version__ = "0.1.0"
