"""Collective operations among a job's workers (the allreduce strategy): a group of
members with a version, and a ring allreduce over it that fails fast and whole."""

from elasticdl_nb.runtime.collective.ring import Group, PeerLost, Ring, RingListener

__all__ = ["Group", "PeerLost", "Ring", "RingListener"]
