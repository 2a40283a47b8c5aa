"""Offline schema checks of generated manifests (test-only; never imported by specserve/).

- Core objects (Deployment, Service, ConfigMap, Pod): the Kubernetes API's OpenAPI schemas that
  the ``kubernetes-validate`` package bundles, in strict mode (unknown fields are errors, as
  ``kubectl apply --validate=strict`` makes them).
- LeaderWorkerSet and DynamoGraphDeployment: their CRDs' ``openAPIV3Schema`` read from upstream
  (``data/*.schema.json``, each citing its repository, path and commit) with ``jsonschema``, made
  strict the same way (an object schema with ``properties`` and no ``additionalProperties`` or
  ``x-kubernetes-preserve-unknown-fields`` rejects other keys: the API server would prune them
  silently). A Dynamo service's ``extraPodSpec`` (a PodSpec plus ``mainContainer``) is checked as
  a core/v1 Pod.
"""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate

DATA = Path(__file__).parent / "data"
K8S_VERSION = "1.33"
CRDS = {("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): "lws_leaderworkerset_v1",
        ("nvidia.com/v1alpha1", "DynamoGraphDeployment"): "dynamo_graphdeployment_v1alpha1"}


class SchemaViolation(AssertionError):
    """A manifest the API server (or its strict validation) would reject."""


def strict(schema: Any) -> Any:
    """``schema`` with unknown object keys rejected (see the module docstring)."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if "properties" in out and "additionalProperties" not in out and \
            not out.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


@cache
def crd_validator(stem: str) -> jsonschema.protocols.Validator:
    data = json.loads((DATA / f"{stem}.schema.json").read_text())
    schema = strict(data["openAPIV3Schema"])
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
    return cls(schema)  # type: ignore[no-any-return]


def check_core(obj: dict[str, Any]) -> None:
    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        where = "/".join(str(p) for p in e.path)
        raise SchemaViolation(f"{obj.get('kind')} {where}: {e.message}") from e


def check_crd(obj: dict[str, Any], stem: str) -> None:
    errors = sorted(crd_validator(stem).iter_errors(obj), key=lambda e: list(e.path))
    if errors:
        e = errors[0]
        raise SchemaViolation(f"{obj['kind']} {'/'.join(map(str, e.path))}: {e.message}")


def pod_of_extra_pod_spec(service: str, eps: dict[str, Any]) -> dict[str, Any]:
    """A Dynamo ``extraPodSpec`` as the core/v1 Pod the operator builds from it (the main
    container named as the operator names it)."""
    spec = {k: copy.deepcopy(v) for k, v in eps.items() if k != "mainContainer"}
    spec["containers"] = [{"name": "main", **copy.deepcopy(eps.get("mainContainer", {}))}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": service.lower()},
            "spec": spec}


def check(obj: dict[str, Any]) -> None:
    """Raise :class:`SchemaViolation` unless ``obj`` passes its schema."""
    stem = CRDS.get((obj.get("apiVersion", ""), obj.get("kind", "")))
    if stem is None:
        check_core(obj)
        return
    check_crd(obj, stem)
    if obj["kind"] == "DynamoGraphDeployment":
        for name, svc in obj["spec"]["services"].items():
            if "extraPodSpec" in svc:
                check_core(pod_of_extra_pod_spec(name, svc["extraPodSpec"]))


def check_all(objects: list[dict[str, Any]]) -> None:
    for obj in objects:
        check(obj)
