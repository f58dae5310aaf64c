"""A sentence-transformers contestant in another Python (``--peers-python``): its ``openvino``
and ``onnx`` backends need optimum(-intel), whose pins would replace this environment's torch
and transformers, so they run in a venv of their own (docs/benchmarks.md says how to make it).

    PEERS_PYTHON benchmarks/cpu_encoders/peer.py MODEL_DIR BACKEND [OV_CONFIG_JSON]

Reads one JSON request per stdin line (``{"query": ..., "documents": [...]}``) and writes its
scores, one JSON list per line, in input order. Standard library and sentence-transformers
only: it does not import the project. ``CrossEncoder.predict`` as a user calls it (batches of
32, padded to each batch's longest pair), the export done once at start, before the first line
is answered. OpenVINO runs with the backend's default ``ov_config`` (the LATENCY hint) unless
one is given: that default leaves the inference precision to the CPU plugin, which computes in
bf16 wherever the CPU has bf16 instructions (AVX512-BF16, AMX), though the model is fp32; the
exact fp32 contestant passes ``INFERENCE_PRECISION_HINT = f32``. The first line written says
what the plugin runs.
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    model_dir, backend = sys.argv[1], sys.argv[2]
    ov_config = json.loads(sys.argv[3]) if len(sys.argv) > 3 else None
    from sentence_transformers import CrossEncoder

    kwargs = {"model_kwargs": {"ov_config": ov_config}} if ov_config else {}
    model = CrossEncoder(model_dir, device="cpu", backend=backend, **kwargs)
    model.predict([("warm-up", "warm-up")])
    info = {"class": type(model.model).__name__}
    compiled = getattr(model.model, "request", None)  # optimum-intel's compiled model
    if hasattr(compiled, "get_property"):
        precision = compiled.get_property("INFERENCE_PRECISION_HINT")
        info["inference_precision"] = (
            precision.get_type_name() if hasattr(precision, "get_type_name") else str(precision)
        )
        info["ov_config"] = model.model.ov_config
    print(json.dumps(info), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        scores = model.predict([(req["query"], d) for d in req["documents"]], batch_size=32)
        print(json.dumps([float(s) for s in scores]), flush=True)


if __name__ == "__main__":
    main()
