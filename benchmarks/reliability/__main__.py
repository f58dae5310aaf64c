"""``python -m benchmarks.reliability``: the suite, or a stub upstream (``stub --port P``)."""

from benchmarks.reliability.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
