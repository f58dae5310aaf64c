"""``python -m benchmarks.passthrough_wrk [overhead] ...``: gateway overhead and passthrough vs LiteLLM.

Without a subcommand, the wrk (or ``--client python``) passthrough run (see the package's
docstring); ``overhead``: what the gateway adds in-process and over HTTP, the passthrough's CPU
against LiteLLM through ``bench --compare``, and ``--tracing CHECKOUT`` (``overhead.py``).
"""

import sys


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "overhead":
        del sys.argv[1]
        from benchmarks.passthrough_wrk.overhead import main as overhead_main

        return overhead_main()
    if {"-h", "--help"} & set(sys.argv[1:]):
        print(__doc__)
    from benchmarks.passthrough_wrk.run import main as run_main

    return run_main()


if __name__ == "__main__":
    raise SystemExit(main())
