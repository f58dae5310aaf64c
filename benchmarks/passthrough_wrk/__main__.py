"""``python -m benchmarks.passthrough_wrk``: the whole run (see the package's docstring)."""

from benchmarks.passthrough_wrk.run import main

if __name__ == "__main__":
    raise SystemExit(main())
