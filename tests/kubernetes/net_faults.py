"""Network faults inside a pod's network namespace, made with iptables through `nsenter`
(the kernel here has no netem: loss, blackholes and resets, no delay; FACTS.md "Network
faults"). Each fault is a context manager whose rules go on entry and come off on exit
(unless the pod ended meanwhile), so a test that fails leaves the pod's network as it was.

    net = PodNetwork(node, core, namespace, "job-worker-1")
    with net.cut_from(["10.96.0.12", "10.244.0.7"]):   # dropped both ways, no reset
        time.sleep(30)

A pod reaches a Service at its cluster IP (kube-proxy translates it outside the pod's
namespace), so a peer is cut off by its Service IP and its pod IP both.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path


class PodNetwork:
    """The network namespace of one pod's container on a real node."""

    def __init__(self, node, core, namespace: str, pod_name: str):
        pod = core.read_namespaced_pod(pod_name, namespace)
        self.pod_name, self.ip = pod_name, pod.status.pod_ip
        self.pid = node.container_pid(pod.status.container_statuses[0].container_id)

    def iptables(self, *args: str) -> None:
        subprocess.run(
            ["nsenter", "-t", str(self.pid), "-n", "iptables", "-w", *args],
            check=True,
            capture_output=True,
            text=True,
        )

    @contextlib.contextmanager
    def rules(self, rules: Sequence[tuple[str, ...]]) -> Iterator[None]:
        """Each rule (chain, match and target arguments) inserted first in its chain, and
        deleted again on exit."""
        added = []
        try:
            for chain, *spec in rules:
                self.iptables("-I", chain, *spec)
                added.append((chain, *spec))
            yield
        finally:
            for chain, *spec in reversed(added):
                try:
                    self.iptables("-D", chain, *spec)
                except subprocess.CalledProcessError:
                    if self._alive():
                        raise
                    break  # the pod ended, and its network namespace with it

    def _alive(self) -> bool:
        """Whether the container's first process still runs (not ended, not a zombie)."""
        time.sleep(0.5)  # (a process being killed: let it finish)
        stat = Path(f"/proc/{self.pid}/stat")
        try:
            return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    def cut_from(self, peers: Sequence[str]) -> contextlib.AbstractContextManager[None]:
        """Every packet to and from `peers` (addresses) dropped: a blackhole, no reset."""
        return self.rules(
            [r for ip in peers for r in (("OUTPUT", "-d", ip, "-j", "DROP"),
                                         ("INPUT", "-s", ip, "-j", "DROP"))]
        )  # fmt: skip

    def cut_off(self) -> contextlib.AbstractContextManager[None]:
        """Every packet in or out dropped but the pod's own loopback."""
        return self.rules(
            [("OUTPUT", "!", "-o", "lo", "-j", "DROP"), ("INPUT", "!", "-i", "lo", "-j", "DROP")]
        )

    def loss(self, probability: float) -> contextlib.AbstractContextManager[None]:
        """Each packet in or out (but loopback) dropped with `probability`."""
        random = ("-m", "statistic", "--mode", "random", "--probability", f"{probability}")
        return self.rules(
            [("OUTPUT", "!", "-o", "lo", *random, "-j", "DROP"),
             ("INPUT", "!", "-i", "lo", *random, "-j", "DROP")]
        )  # fmt: skip

    def resets(self, port: int, probability: float) -> contextlib.AbstractContextManager[None]:
        """Each TCP segment arriving for local `port` answered with a reset (the
        connection torn down) with `probability`."""
        random = ("-m", "statistic", "--mode", "random", "--probability", f"{probability}")
        return self.rules(
            [("INPUT", "-p", "tcp", "--dport", str(port), *random,
              "-j", "REJECT", "--reject-with", "tcp-reset")]
        )  # fmt: skip
