"""``python -m benchmarks.gpu_suite [encoders|qwen3] ...``: the GPU engine runs.

Without a subcommand, the whole Qwen3 run (see the package's docstring); ``encoders``: the
cross-encoder runtimes (``encoders.py``); ``qwen3``: every Qwen3 runtime and size
(``qwen3.py``); ``host``: the host's share of an idle d100 request, on the CPU
(``host_profile.py``). Each takes its own ``--help``.
"""

import sys

SUBCOMMANDS = {
    "encoders": "benchmarks.gpu_suite.encoders",
    "qwen3": "benchmarks.gpu_suite.qwen3",
    "host": "benchmarks.gpu_suite.host_profile",
}


def main() -> None:
    import importlib

    if len(sys.argv) > 1 and sys.argv[1] in SUBCOMMANDS:
        name = sys.argv.pop(1)
        sys.argv[0] = f"python -m benchmarks.gpu_suite {name}"
        importlib.import_module(SUBCOMMANDS[name]).main()
        return
    if {"-h", "--help"} & set(sys.argv[1:]):
        print(__doc__)
    from benchmarks.gpu_suite.run import main as run_main

    run_main()


if __name__ == "__main__":
    main()
