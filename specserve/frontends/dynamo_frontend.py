"""NVIDIA Dynamo's OpenAI frontend with TCP_NODELAY on its HTTP listener:
``python -m specserve.frontends.dynamo_frontend [python -m dynamo.frontend's arguments]``.

Runs ``dynamo.frontend.main.main()`` (ai-dynamo 1.6.1, what ``python -m dynamo.frontend`` runs)
in this process, unchanged, with :func:`specserve.frontends.nodelay.watch` on a daemon thread:
once the frontend binds ``--http-port`` the option is set on that listener (and on the
response-stream listener it binds too), so every client connection it accepts has Nagle's
algorithm off (why: :mod:`specserve.frontends.nodelay`). It prints :data:`READY_LINE` with the
port when done; ``specserve serve --frontend dynamo`` counts the frontend ready only after that
line, so no client connection predates the option.
"""

from __future__ import annotations

import sys

READY_LINE = "specserve: TCP_NODELAY set on the frontend's HTTP listener, port"


def http_port(argv: list[str]) -> int | None:
    """``--http-port`` of Dynamo's frontend arguments (None: not given)."""
    for i, a in enumerate(argv):
        if a == "--http-port" and i + 1 < len(argv):
            return int(argv[i + 1])
        if a.startswith("--http-port="):
            return int(a.split("=", 1)[1])
    return None


def main() -> None:
    from specserve.frontends.nodelay import watch

    port = http_port(sys.argv[1:])

    def on_set(p: int) -> None:
        if p == port:
            print(f"{READY_LINE} {p}", flush=True)

    watch(on_set, until=lambda seen: port is None or port in seen)
    sys.argv = ["python -m dynamo.frontend", *sys.argv[1:]]
    from dynamo.frontend.main import main as frontend_main

    frontend_main()


if __name__ == "__main__":
    main()
