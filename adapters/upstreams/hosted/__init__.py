"""Hosted rerank APIs as engines: one engine (engine.py) and one table row per provider (providers.py)."""
