"""User-facing errors.

Everything a user can get wrong (a missing file, a mismatched vocabulary, a bad flag value) raises
:class:`SpecserveError` with one line that names the file or value and the mismatch. The CLI turns
it into that line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations


class SpecserveError(Exception):
    """A clear, one-line problem with the user's input or environment (exit code 2)."""

    exit_code = 2


class ServerError(SpecserveError):
    """tritonserver could not be found, started or reached."""

    exit_code = 3
