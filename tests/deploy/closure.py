"""Reference closure of a manifest set (test-only): every object a manifest names by
reference (ServiceAccount, ConfigMap, Secret, PersistentVolumeClaim, Role) must be one the set
generates, or one the deploy summary lists under ``requires`` - what ``kubectl apply`` of the set
would otherwise leave pods pending on (kubeconform checks each object alone; this checks the
set)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def references(obj: Any) -> Iterator[tuple[str, str]]:
    """(kind, name) of every reference inside ``obj`` (pod specs at any depth, RoleBindings)."""
    if isinstance(obj, list):
        for v in obj:
            yield from references(v)
        return
    if not isinstance(obj, dict):
        return
    if isinstance(obj.get("serviceAccountName"), str):
        yield "ServiceAccount", obj["serviceAccountName"]
    if isinstance(obj.get("configMap"), dict):
        yield "ConfigMap", obj["configMap"]["name"]
    if isinstance(obj.get("secret"), dict):
        yield "Secret", obj["secret"]["secretName"]
    if isinstance(obj.get("persistentVolumeClaim"), dict):
        yield "PersistentVolumeClaim", obj["persistentVolumeClaim"]["claimName"]
    for key, kind in (("configMapKeyRef", "ConfigMap"), ("secretKeyRef", "Secret"),
                      ("configMapRef", "ConfigMap"), ("secretRef", "Secret")):
        if isinstance(obj.get(key), dict):
            yield kind, obj[key]["name"]
    for secret in obj.get("imagePullSecrets") or []:
        yield "Secret", secret["name"]
    if obj.get("kind") == "RoleBinding":
        yield obj["roleRef"]["kind"], obj["roleRef"]["name"]
        for subject in obj.get("subjects") or []:
            yield subject["kind"], subject["name"]
    for value in obj.values():
        yield from references(value)


def missing(objects: list[dict[str, Any]], requires: list[dict[str, str]]) -> list[str]:
    """References neither generated nor required, as ``Kind/name``."""
    have = {(o["kind"], o["metadata"]["name"]) for o in objects}
    have |= {(r["kind"], r["name"]) for r in requires}
    return sorted({f"{k}/{n}" for o in objects for k, n in references(o) if (k, n) not in have})
