"""Backends: the hands that start, stop and watch a job's processes.

They hold no policy. Inside the master, an `InstanceLauncher` launches and kills workers
and parameter servers and reports what happened to them as `InstanceEvent`s; on the
client side, a backend submits the master and finds jobs again. The elastic policy over
those events lives in the master (`elasticdl_nb.runtime.master.instances`).
"""

from elasticdl_nb.backends.instance_event import InstanceEvent, InstanceLauncher

__all__ = ["InstanceEvent", "InstanceLauncher"]
