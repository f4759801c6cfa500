"""`Job.status()` against a link whose end appears when a test says: an ended job answers
from what its end left without asking its master, a master that cannot be reached is not
waited for past the end being recorded, and an end the master decided but has not
recorded yet reads as running (`ending`), which is what `jobs()` says of it too."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from elasticdl_nb.backends.job_records import JobRecord
from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
from elasticdl_nb.runtime.protocol import elasticdl_pb2_grpc as rpc
from elasticdl_nb.runtime.protocol.channels import listen, make_server
from elasticdl_nb.sdk.job import Job

TOKEN = "t" * 32
ENDED = {"name": "j", "state": "succeeded", "error": ""}


class Link:
    """A master at `address` until the end is recorded (as Kubernetes' link reads it)."""

    def __init__(self, address: str, tmp_path):
        self._address, self.files, self.final = address, tmp_path, None
        self.asked_for_address = 0

    def address(self) -> str | None:
        self.asked_for_address += 1
        return None if self.final else self._address

    def final_state(self) -> dict | None:
        return self.final

    def waiting_reason(self) -> str:
        return ""

    def lost_reason(self) -> str:
        return ""


def job_on(link: Link, tmp_path) -> Job:
    job = Job(JobRecord("j", tmp_path, TOKEN, 0.0))
    job._link = link
    return job


@pytest.fixture
def nobody(tmp_path):
    """An address where nothing listens (its port held, so nothing else takes it)."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{held.getsockname()[1]}"


@pytest.fixture
def master_saying():
    """A master whose GetStatus answers the state it is given."""
    servers = []

    def start(state: str) -> str:
        class Servicer(rpc.MasterServicer):
            def GetStatus(self, request, context):
                return pb.JsonMessage(json=json.dumps({"name": "j", "state": state}))

        server = make_server(TOKEN, "master", threads=2)
        rpc.add_MasterServicer_to_server(Servicer(), server)
        address = f"127.0.0.1:{listen(server, '127.0.0.1:0')}"
        server.start()
        servers.append(server)
        return address

    yield start
    for server in servers:
        server.stop(0)


def test_an_ended_job_answers_from_its_end_without_asking_its_master(tmp_path, nobody):
    link = Link(nobody, tmp_path)
    link.final = ENDED
    assert job_on(link, tmp_path).status() == ENDED
    assert link.asked_for_address == 0


def test_a_master_out_of_reach_is_not_waited_for_past_the_end_being_recorded(tmp_path, nobody):
    link = Link(nobody, tmp_path)
    threading.Timer(0.5, lambda: setattr(link, "final", ENDED)).start()
    t0 = time.monotonic()
    assert job_on(link, tmp_path).status() == ENDED
    assert time.monotonic() - t0 < 5  # (its patience is 15 s)


def test_an_end_decided_but_not_recorded_reads_as_running(tmp_path, master_saying):
    link = Link(master_saying("succeeded"), tmp_path)
    status = job_on(link, tmp_path).status()
    assert (status["state"], status["ending"]) == ("running", "succeeded")
    link.final = ENDED  # recorded: the master is no longer asked
    assert job_on(link, tmp_path).status() == ENDED


def test_a_running_master_answers(tmp_path, master_saying):
    status = job_on(Link(master_saying("running"), tmp_path), tmp_path).status()
    assert status == {"name": "j", "state": "running"}
