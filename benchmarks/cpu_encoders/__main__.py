"""``python -m benchmarks.cpu_encoders``: the whole run (see the package's docstring)."""

import sys
import threading

from benchmarks.cpu_encoders.cli import main

if __name__ == "__main__":
    threading.excepthook = lambda a: print(a, file=sys.stderr)
    main()
