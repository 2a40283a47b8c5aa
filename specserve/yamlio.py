"""One YAML writer for everything specserve emits (PyYAML ``SafeDumper``): the LLM-API
``extra_llm_api_options.yaml``, Triton ``llmapi`` ``model.yaml`` and the deploy manifests.

Keys keep their insertion order, multi-line strings (scripts, embedded YAMLs) are block
literals, and no anchors/aliases are written (each object spelled out), so a reader that does not
resolve aliases (``kubectl``, Helm, TensorRT-LLM's ``yaml.safe_load``) reads what was meant.
"""

from __future__ import annotations

from typing import Any

import yaml


class _Dumper(yaml.SafeDumper):  # type: ignore[misc]
    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


def _list(dumper: yaml.SafeDumper, value: list[Any]) -> yaml.SequenceNode:
    flat = all(not isinstance(v, (dict, list)) for v in value)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", value, flow_style=flat)


class _FlowListDumper(_Dumper):
    """Config files (LLM-API YAML, model.yaml): short lists inline, as upstream's examples."""


_Dumper.add_representer(str, _str)
_FlowListDumper.add_representer(list, _list)


def dump(data: Any) -> str:
    """One YAML document: block mappings, lists of scalars in flow style (``[1, 2]``)."""
    text: str = yaml.dump(data, Dumper=_FlowListDumper, sort_keys=False, width=100)
    return text


def dump_all(objects: list[dict[str, Any]]) -> str:
    """Several documents joined by ``---`` (Kubernetes manifests; block lists throughout)."""
    return "---\n".join(yaml.dump(o, Dumper=_Dumper, sort_keys=False, width=100)
                        for o in objects)
