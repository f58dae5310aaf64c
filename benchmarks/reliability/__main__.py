"""``python -m benchmarks.reliability``: the suite, a stub upstream (``stub --port P``), or ``audit --path SITE --out DIR``."""

from benchmarks.reliability.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
