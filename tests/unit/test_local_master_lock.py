"""A local job's masters keep the rule a Kubernetes job's keep with a Lease (one acts at a
time): the master lock in the job directory. A real process holds it; frozen (SIGSTOP), it
still holds it and a second master waits; only its death lets the second one in."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading

from elasticdl_nb.backends.local.master_site import LocalSite
from tests.integration.faults import wait_for

HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from elasticdl_nb.backends.local.master_site import LocalSite
    LocalSite(Path(sys.argv[1])).open()
    print("held", flush=True)
    time.sleep(600)
    """
)


def test_a_second_master_waits_while_the_first_lives_frozen_or_not_and_goes_on_at_its_death(
    tmp_path,
):
    first = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert first.stdout.readline().strip() == "held"
        first.send_signal(signal.SIGSTOP)
        second = threading.Thread(target=LocalSite(tmp_path).open, daemon=True)
        second.start()
        second.join(1.5)
        assert second.is_alive(), "a second master acted beside a frozen first one"
        os.kill(first.pid, signal.SIGKILL)
        wait_for(lambda: not second.is_alive(), 5, "the second master to take the lock")
    finally:
        if first.poll() is None:
            os.kill(first.pid, signal.SIGKILL)
        first.wait()
    assert oct((tmp_path / "master.lock").stat().st_mode & 0o777) == "0o600"
