"""Models and the rerank work: the model registry, the rerank service and its request -> job building, the response cache, load-failure fixes, telemetry."""
