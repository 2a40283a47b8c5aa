"""Pure template rendering for Triton model configs.

Templates use ``${name}`` placeholders like TensorRT-LLM's ``triton_backend/tools/fill_template.py``
(string.Template syntax), but unlike that tool, which uses ``safe_substitute`` and leaves unknown
placeholders in place (the BLS model then silently treats them as "unset"), :func:`render` is
strict: a key that the template does not contain, a placeholder without a value, or any ``${``
left in the output is an error.
"""

from __future__ import annotations

import re
import string
from importlib import resources

from specserve.errors import SpecserveError

_PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class TemplateError(SpecserveError):
    """A template and its mapping do not match."""


def placeholders(template: str) -> set[str]:
    """Names of all ``${name}`` placeholders in ``template``."""
    return set(_PLACEHOLDER.findall(template))


def render(template: str, mapping: dict[str, str], name: str = "template") -> str:
    """Fill every placeholder of ``template`` from ``mapping``; strict both ways."""
    wanted = placeholders(template)
    unknown = sorted(set(mapping) - wanted)
    if unknown:
        raise TemplateError(f"{name}: unknown keys {unknown} (not in the template)")
    missing = sorted(wanted - set(mapping))
    if missing:
        raise TemplateError(f"{name}: no value for placeholders {missing}")
    bad = sorted(k for k, v in mapping.items() if not isinstance(v, str))
    if bad:
        raise TemplateError(f"{name}: values must be strings, got non-strings for {bad}")
    out = string.Template(template).substitute(mapping)
    if "${" in out:
        line = next(ln for ln in out.splitlines() if "${" in ln)
        raise TemplateError(f"{name}: unfilled '${{' left after rendering: {line.strip()!r}")
    return out


def load_template(rel: str) -> str:
    """Read a packaged template, e.g. ``tensorrt_llm/config.pbtxt``."""
    path = resources.files("specserve.triton").joinpath("templates", *rel.split("/"))
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise TemplateError(f"templates/{rel}: no such packaged template") from e
