"""``python -m benchmarks.passthrough_wrk ...``: passthrough vs LiteLLM (see the package's docstring)."""

from benchmarks.passthrough_wrk.run import main

if __name__ == "__main__":
    raise SystemExit(main())
