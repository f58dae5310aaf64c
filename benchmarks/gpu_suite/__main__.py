"""``python -m benchmarks.gpu_suite {encoders|qwen3} ...``: the GPU engine runs.

``encoders``: the cross-encoder runtimes (``encoders.py``); ``qwen3``: every Qwen3 runtime and
size, and the issue's targets (``qwen3.py``). Each takes its own ``--help``.
"""

import sys

SUBCOMMANDS = {
    "encoders": "benchmarks.gpu_suite.encoders",
    "qwen3": "benchmarks.gpu_suite.qwen3",
}


def main() -> None:
    import importlib

    if len(sys.argv) < 2 or sys.argv[1] not in SUBCOMMANDS:
        print(__doc__)
        sys.exit(0 if {"-h", "--help"} & set(sys.argv[1:]) else 2)
    name = sys.argv.pop(1)
    sys.argv[0] = f"python -m benchmarks.gpu_suite {name}"
    importlib.import_module(SUBCOMMANDS[name]).main()


if __name__ == "__main__":
    main()
