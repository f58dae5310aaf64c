"""CPU runtimes for encoder families: the checkpoint exported once to OpenVINO IR and cached
(``export``), the parity gate of reduced precisions (``parity``), and the engine (``engine``)."""
