"""What ``specserve bench --serve-json FILE`` reads from ``specserve serve --frontend dynamo
--format json``: the frontend's URL and, per served model name, its workers' metrics URLs
(:meth:`specserve.frontends.dynamo_serve.DynamoDeployment.describe`). Pure; no import of the
serve side: the JSON is the contract."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specserve.errors import SpecserveError


@dataclass(frozen=True)
class ServeTargets:
    """The frontend (HOST:PORT), the served names, and each name's worker metrics URLs."""

    frontend: str
    models: tuple[str, ...]
    metrics: dict[str, tuple[str, ...]]

    def urls_of(self, model: str) -> tuple[str, ...]:
        if model not in self.metrics:
            raise SpecserveError(f"--serve-json: no workers serve {model!r} (served: "
                                 f"{', '.join(self.models)})")
        return self.metrics[model]


def read_serve_json(path: str | Path) -> ServeTargets:
    """The targets in ``path``; SpecserveError naming the file when it is not that JSON."""
    try:
        d: Any = json.loads(Path(path).read_text())
        frontend = str(d["frontend"]).removeprefix("http://").rstrip("/")
        models = tuple(str(m) for m in d["models"])
        metrics: dict[str, list[str]] = {m: [] for m in models}
        for w in d["workers"]:
            metrics.setdefault(str(w["model"]), []).append(str(w["metrics_url"]))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SpecserveError(f"{path}: not the JSON of `specserve serve --frontend dynamo "
                             f"--format json` ({type(e).__name__}: {e})") from None
    return ServeTargets(frontend, models, {m: tuple(u) for m, u in metrics.items()})
