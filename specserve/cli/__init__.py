"""Thin Click commands over the library. Each module here that defines ``command`` (a
``click.Command``) is registered on the ``specserve`` group. Modules must not import torch or
other heavy libraries at import time, so that ``specserve --help`` stays fast."""
