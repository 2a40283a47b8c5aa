"""A stand-in module in ``sys.modules`` for the length of a ``with`` (Triton's
``triton_python_backend_utils`` exists only inside the Python backend's stub): the modules
named in ``reimport`` are dropped before and after, so they import against the stand-in and
later tests get the real thing."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def installed(module: types.ModuleType, reimport: tuple[str, ...] = ()) -> Iterator[None]:
    saved = sys.modules.get(module.__name__)
    sys.modules[module.__name__] = module
    for name in reimport:
        sys.modules.pop(name, None)
    try:
        yield
    finally:
        for name in reimport:
            sys.modules.pop(name, None)
        if saved is None:
            sys.modules.pop(module.__name__, None)
        else:
            sys.modules[module.__name__] = saved
