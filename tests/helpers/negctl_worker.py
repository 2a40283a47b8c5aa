"""A specserve Dynamo worker with the TEST-ONLY residual-skipping verifier
(:mod:`tests.helpers.negative_control`) patched over the step executor's rejection sampler in
its own process: ``python -m tests.helpers.negctl_worker [the worker's arguments]``. The product
has no switch for this; a test starts it in place of ``specserve.frontends.dynamo_worker``."""

from __future__ import annotations

import sys

from tests.helpers.negative_control import install_test_only_verifier


def main() -> int:
    install_test_only_verifier("skip_residual")
    from specserve.frontends.dynamo_worker import main as worker_main

    return worker_main()


if __name__ == "__main__":
    sys.exit(main())
