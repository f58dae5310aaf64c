"""``python -m benchmarks.reliability``: the suite, or ``audit --path SITE --out DIR``."""

from benchmarks.reliability.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
