"""A specserve Dynamo worker whose serving loop wedges (TEST-ONLY): ``python -m
tests.helpers.wedge_worker [the worker's arguments]`` with ``SPECSERVE_TEST_WEDGE_FILE=PATH``
in its environment; while PATH exists, every step of the loop blocks (the process, its runtime
threads and its sockets stay up: a wedged step, not a stopped process). The product has no
switch for this; a test starts it in place of ``specserve.frontends.dynamo_worker``."""

from __future__ import annotations

import os
import sys
import time
from typing import Any


def install_wedge(path: str) -> None:
    from specserve.frontends import dynamo_worker

    loop_class: Any = dynamo_worker.ServingLoop
    step = loop_class._step

    def wedged_step(self: Any) -> None:
        while os.path.exists(path):
            time.sleep(0.05)
        step(self)

    loop_class._step = wedged_step


def main() -> int:
    install_wedge(os.environ["SPECSERVE_TEST_WEDGE_FILE"])
    from specserve.frontends.dynamo_worker import main as worker_main

    return worker_main()


if __name__ == "__main__":
    sys.exit(main())
