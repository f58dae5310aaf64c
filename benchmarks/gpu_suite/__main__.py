"""``python -m benchmarks.gpu_suite``: the whole GPU run (see the package's docstring)."""

from benchmarks.gpu_suite.run import main

if __name__ == "__main__":
    main()
