"""``python -m benchmarks.engine_bench``: the variants, or ``--cpu-compare`` (see the package's docstring)."""

from benchmarks.engine_bench.cli import main

if __name__ == "__main__":
    main()
