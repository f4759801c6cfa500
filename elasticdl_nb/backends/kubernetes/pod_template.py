"""The user's pod template (`pod_template=` a YAML file), merged into every pod we make.

A cluster's specifics — node selectors, tolerations, image pull secrets, extra volumes,
annotations — are written once as pod fields, the way `kubectl` users write them:

    metadata: {annotations: {team: ranking}}
    spec:
      nodeSelector: {pool: training}
      tolerations: [{key: spot, operator: Exists}]
      containers: [{volumeMounts: [{name: data, mountPath: /data}]}]
      volumes: [{name: data, persistentVolumeClaim: {claimName: data}}]

Mappings merge key by key, the template's scalars win, other lists are appended to ours.
A container in the template without a name applies to every container; with a name, to
that one.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from elasticdl_nb.spec.errors import SpecError


def load_template(path: str) -> dict[str, Any]:
    import yaml

    file = Path(path).expanduser()
    try:
        template = yaml.safe_load(file.read_text())
    except FileNotFoundError:
        raise SpecError(f"pod_template {path!r} does not exist (looked for {file}).") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"pod_template {path!r} is not valid YAML: {exc}") from None
    if template is None:
        return {}
    if not isinstance(template, dict) or set(template) - {"apiVersion", "kind", "metadata", "spec"}:
        raise SpecError(
            f"pod_template {path!r} must hold pod fields: 'metadata' and/or 'spec' (as in "
            "a Pod manifest), not a list or other keys."
        )
    return {k: v for k, v in template.items() if k in ("metadata", "spec")}


def merge_into_pod(pod: dict[str, Any], template_path: str) -> dict[str, Any]:
    """`pod` with the template at `template_path` merged in ('' leaves it as it is)."""
    if not template_path:
        return pod
    return _merge(pod, load_template(template_path), path="")


def _merge(ours: Any, theirs: Any, path: str) -> Any:
    if isinstance(ours, dict) and isinstance(theirs, dict):
        merged = dict(ours)
        for key, value in theirs.items():
            here = f"{path}.{key}" if path else key
            merged[key] = _merge(ours[key], value, here) if key in ours else copy.deepcopy(value)
        return merged
    if isinstance(ours, list) and isinstance(theirs, list):
        if path == "spec.containers":
            return _merge_containers(ours, theirs)
        return [*ours, *copy.deepcopy(theirs)]
    return copy.deepcopy(theirs)


def _merge_containers(ours: list[dict], theirs: list[dict]) -> list[dict]:
    merged = list(ours)
    for extra in theirs:
        name = extra.get("name")
        targets = [i for i, c in enumerate(merged) if name is None or c.get("name") == name]
        if not targets:  # a sidecar of the user's
            merged.append(copy.deepcopy(extra))
        for i in targets:
            merged[i] = _merge(merged[i], {k: v for k, v in extra.items() if k != "name"}, "c")
    return merged
