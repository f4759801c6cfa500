"""The JobSpec options that only the Kubernetes backend reads, parsed and checked.

Resources are written as ElasticDL wrote them, `cpu=1,memory=2Gi`; a quantity the API
server would refuse is refused here, before anything is created, naming the option.
"""

from __future__ import annotations

import re

from elasticdl_nb.spec.errors import SpecError

# Kubernetes' quantity grammar, in short: a decimal number with an optional binary
# (Ki..Ei) or decimal (m, k, M..E) suffix, or an exponent (1e3).
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?([eE][0-9]+|m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
_RESOURCE_NAME = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
_VOLUME = re.compile(r"^(pvc:[a-z0-9]([-a-z0-9.]*[a-z0-9])?|hostPath:/.*)$")


def parse_resources(option: str, text: str) -> dict[str, str]:
    """'cpu=1,memory=2Gi' -> {'cpu': '1', 'memory': '2Gi'}; SpecError naming the option."""
    resources: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, quantity = (s.strip() for s in part.partition("="))
        if not sep or not _RESOURCE_NAME.match(name):
            raise SpecError(
                f"Option '{option}': {part!r} is not NAME=QUANTITY. Write e.g. "
                "'cpu=1,memory=2Gi' (names: cpu, memory, ephemeral-storage, nvidia.com/gpu)."
            )
        if not _QUANTITY.match(quantity):
            raise SpecError(
                f"Option '{option}': {quantity!r} is not a Kubernetes quantity for {name}. "
                "Write e.g. cpu=500m or cpu=2, memory=512Mi or memory=4Gi."
            )
        resources[name] = quantity
    return resources


_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}


def quantity_bytes(quantity: str) -> int:
    """A memory quantity ('2Gi', '512M', '1e9') in bytes."""
    number = re.match(r"^[0-9.]+([eE][0-9]+)?", quantity)
    if not number or not _QUANTITY.match(quantity):
        raise SpecError(f"{quantity!r} is not a Kubernetes quantity; write e.g. 512Mi or 4Gi.")
    suffix = quantity[number.end() :]
    scale = _BINARY.get(suffix) or _DECIMAL[suffix]
    return int(float(number.group(0)) * scale)


def bytes_quantity(size: int) -> str:
    """Bytes as the shortest exact binary quantity ('3Gi', '1536Mi')."""
    for suffix in ("Gi", "Mi", "Ki"):
        if size % _BINARY[suffix] == 0:
            return f"{size // _BINARY[suffix]}{suffix}"
    return str(size)


def parse_env(items: list[str]) -> dict[str, str]:
    """['A=1', 'B=x'] -> {'A': '1', 'B': 'x'}; SpecError for a malformed entry."""
    env: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not _ENV_NAME.match(name):
            raise SpecError(
                f"Option 'env': {item!r} is not NAME=VALUE (NAME: letters, digits, '_', "
                "'.', '-', not starting with a digit)."
            )
        env[name] = value
    return env


def parse_run_as(text: str) -> tuple[int, int]:
    """'1001:100' -> (1001, 100); SpecError for anything else."""
    uid, sep, gid = text.partition(":")
    if not (sep and uid.isdigit() and gid.isdigit()):
        raise SpecError(
            f"Option 'run_as': {text!r} is not UID:GID (two numbers, e.g. 1001:1001): the "
            "user and group the job's pods run as."
        )
    return int(uid), int(gid)


def check_kubernetes_options(spec) -> None:
    """Everything the Kubernetes options must satisfy, whichever backend is chosen (their
    defaults do), so a typo is found before the job is moved to a cluster."""
    for role in ("master", "ps", "worker"):
        parse_resources(f"{role}_resources", getattr(spec, f"{role}_resources"))
    parse_env(spec.env)
    if spec.max_memory:
        try:
            quantity_bytes(spec.max_memory)
        except SpecError as exc:
            raise SpecError(f"Option 'max_memory': {exc}") from None
    if spec.run_as:
        uid, _ = parse_run_as(spec.run_as)
        if uid == 0:
            raise SpecError(
                "Option 'run_as': '0:...' is root. A job's pods need no privileges: give "
                "the uid:gid of a plain user (the image's own is 1000:1000)."
            )
    if spec.shared_volume and not _VOLUME.match(spec.shared_volume):
        raise SpecError(
            f"Option 'shared_volume': {spec.shared_volume!r} is neither 'pvc:CLAIM' nor "
            "'hostPath:/absolute/dir'. The job directory (staged data, checkpoints, the "
            "journal, the exported model) lives there, shared by every pod."
        )
