"""Models and the rerank work: the model registry, the rerank service, the response cache, load-failure fixes, telemetry."""
