"""Cluster DNS for the test nodes (issue 36): `NAME.NS.svc.cluster.local` answers with the
Service's cluster IP in every pod, as CoreDNS makes it on a real cluster.

Debian has no CoreDNS; `dnsmasq` (dnsmasq-base) is a real DNS server. The first node runs
two processes for the whole cluster, both naming the node's dir on their command line
(so the node's stop, and `clean()` after a crash, find them):

- dnsmasq, on the first node's pod gateway (`POD_GATEWAY`: every node's pods route to
  it), UDP and TCP port 53. It answers from the hosts files of a directory it watches
  (`--hostsdir`: a new or changed file is read at once, a removed entry forgotten), is
  the authority for `cluster.local` (a name there that no Service has is NXDOMAIN at
  once) and forwards nothing (no upstream: nothing leaves the machine; other names are
  refused). It reads no configuration of the machine's (/etc/dnsmasq.conf, /etc/hosts,
  /etc/resolv.conf).
- this module as a program, `python -m tests.kubernetes.cluster_dns DIR KUBECONFIG`:
  it lists and watches every Service with the admin's kubeconfig and rewrites
  `DIR/services` (atomically) whenever one with a cluster IP comes, changes or goes.

The kubelets point their pods at it (`--cluster-dns`, `--cluster-domain`): a pod with
the default dnsPolicy (ClusterFirst) gets `nameserver POD_GATEWAY` and `search
NS.svc.cluster.local svc.cluster.local cluster.local`, so `NAME.NS.svc` resolves.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

CLUSTER_DOMAIN = "cluster.local"
RECORDS_FILE = "services"


def dnsmasq_argv(records_dir: Path, address: str) -> list[str]:
    """dnsmasq, serving the Services' records from `records_dir` on `address`:53."""
    return [
        "/usr/sbin/dnsmasq",
        "--keep-in-foreground",
        "--log-facility=-",  # stderr, into the node's log
        "--conf-file=/dev/null",  # none of the machine's configuration
        "--no-hosts",
        "--no-resolv",
        "--no-poll",
        "--pid-file=",  # (no pid file: the node tracks its process)
        "--user=root",  # the records are in the node's dir, which only root may enter
        "--bind-interfaces",
        f"--listen-address={address}",
        "--port=53",
        f"--hostsdir={records_dir}",
        f"--local=/{CLUSTER_DOMAIN}/",
        "--local-ttl=1",  # a Service's address may change: clients keep it a second
    ]


def records_argv(records_dir: Path, kubeconfig: Path) -> list[str]:
    """This module as the program that keeps the records."""
    return [sys.executable, "-m", "tests.kubernetes.cluster_dns", str(records_dir), str(kubeconfig)]


def hosts_lines(services: dict[tuple[str, str], str]) -> str:
    """The hosts file of `services` ((namespace, name) -> cluster IP)."""
    return "".join(
        f"{ip} {name}.{namespace}.svc.{CLUSTER_DOMAIN}\n"
        for (namespace, name), ip in sorted(services.items())
    )


def _cluster_ip(service) -> str | None:
    ip = service.spec.cluster_ip
    return ip if ip and ip != "None" else None  # headless and ExternalName: no record


def _write(records_dir: Path, services: dict[tuple[str, str], str]) -> None:
    target = records_dir / RECORDS_FILE
    tmp = records_dir / f".{RECORDS_FILE}.tmp"  # (dnsmasq reads every file but dot-files)
    tmp.write_text(hosts_lines(services))
    os.replace(tmp, target)


def keep_records(records_dir: Path, kubeconfig: Path) -> None:
    """List every Service, write the records, then follow the watch; on any error
    (the API server restarting, a watch expired) list again half a second later."""
    from kubernetes import client, config, watch

    core = client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig)))
    while True:
        try:
            listed = core.list_service_for_all_namespaces()
            services = {
                (s.metadata.namespace, s.metadata.name): ip
                for s in listed.items
                if (ip := _cluster_ip(s))
            }
            _write(records_dir, services)
            stream = watch.Watch().stream(
                core.list_service_for_all_namespaces,
                resource_version=listed.metadata.resource_version,
                timeout_seconds=300,
            )
            for event in stream:
                s = event["object"]
                key, ip = (s.metadata.namespace, s.metadata.name), _cluster_ip(s)
                if event["type"] == "DELETED" or ip is None:
                    changed = services.pop(key, None) is not None
                else:
                    changed = services.get(key) != ip
                    services[key] = ip
                if changed:
                    _write(records_dir, services)
        except Exception as exc:  # noqa: BLE001 - said, and listed again
            print(f"cluster DNS records: {type(exc).__name__}: {exc}", flush=True)
            time.sleep(0.5)


if __name__ == "__main__":
    keep_records(Path(sys.argv[1]), Path(sys.argv[2]))
