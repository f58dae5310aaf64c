"""The query and documents the encoder-family tests score (test_families, test_st_layouts,
test_openvino_engine): one relevant document, near misses, a one-word document and one long
enough to be chunked by small windows."""

Q = "What is the capital of the United States?"
DOCS = [
    "Carson City is the capital city of the American state of Nevada.",
    "Washington, D.C. is the capital of the United States. It is a federal district.",
    "Capital punishment has existed in the United States since before it was a country.",
    "Quantum computing uses qubits.",
    "yes",
    " ".join(["The quick brown fox jumps over the lazy dog."] * 6),
]
