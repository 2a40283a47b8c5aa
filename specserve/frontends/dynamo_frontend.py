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

import os
import sys
from collections.abc import Mapping

READY_LINE = "specserve: TCP_NODELAY set on the frontend's HTTP listener, port"


#: Dynamo 1.6.1's frontend port when neither ``--http-port`` nor ``DYN_HTTP_PORT`` gives one
#: (``dynamo/frontend/frontend_args.py``: ``--http-port``, env ``DYN_HTTP_PORT``, default 8000).
DEFAULT_HTTP_PORT = 8000


def http_port(argv: list[str], env: Mapping[str, str] | None = None) -> int:
    """The port Dynamo's frontend will bind, resolved as it does: ``--http-port`` of its
    arguments, else ``DYN_HTTP_PORT`` (what a DynamoGraphDeployment's operator may set), else
    :data:`DEFAULT_HTTP_PORT`."""
    for i, a in enumerate(argv):
        if a == "--http-port" and i + 1 < len(argv):
            return int(argv[i + 1])
        if a.startswith("--http-port="):
            return int(a.split("=", 1)[1])
    value = (os.environ if env is None else env).get("DYN_HTTP_PORT", "")
    return int(value) if value else DEFAULT_HTTP_PORT


def main() -> None:
    from specserve.frontends.nodelay import watch

    port = http_port(sys.argv[1:])

    def on_set(p: int) -> None:
        if p == port:
            print(f"{READY_LINE} {p}", flush=True)

    watch(on_set, until=lambda seen: port in seen)
    sys.argv = ["python -m dynamo.frontend", *sys.argv[1:]]
    from dynamo.frontend.main import main as frontend_main

    frontend_main()


if __name__ == "__main__":
    main()
