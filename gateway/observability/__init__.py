"""Logs and per-key usage metrics (request-phase and model-state telemetry lives with the models in gateway.serving)."""
