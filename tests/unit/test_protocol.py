"""The wire: tensors as raw bytes, the job token on every call, stubs in step with the proto."""

import subprocess
import sys

import grpc
import numpy as np
import pytest

from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
from elasticdl_nb.runtime.protocol import elasticdl_pb2_grpc as rpc
from elasticdl_nb.runtime.protocol.channels import listen, make_server, open_channel
from elasticdl_nb.runtime.protocol.tensors import to_array, to_tensor


@pytest.mark.parametrize(
    "array",
    [
        np.float32(3.5) * np.ones(()),
        np.arange(12, dtype=np.int64).reshape(3, 4),
        np.random.default_rng(0).normal(size=(2, 3, 5)).astype(np.float16),
        np.zeros((0, 16), np.float32),
        np.arange(6, dtype=np.float64).reshape(2, 3).T,  # not C-contiguous
    ],
)
def test_tensors_round_trip_exactly(array):
    back = to_array(pb.Tensor.FromString(to_tensor(array).SerializeToString()))
    assert back.dtype == array.dtype and back.shape == array.shape
    np.testing.assert_array_equal(back, array)


def test_object_arrays_are_refused():
    with pytest.raises(TypeError, match="object array"):
        to_tensor(np.array(["a", None], dtype=object))


class _Status(rpc.MasterServicer):
    def GetStatus(self, request, context):
        return pb.JsonMessage(json='{"ok": true}')


@pytest.fixture
def server_address():
    server = make_server("s3cret", "master")
    rpc.add_MasterServicer_to_server(_Status(), server)
    port = listen(server, "127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(0)


def test_calls_with_the_job_token_are_served(server_address):
    stub = rpc.MasterStub(open_channel(server_address, "s3cret", "master"))
    assert stub.GetStatus(pb.Empty(), timeout=5).json == '{"ok": true}'


@pytest.mark.parametrize("token", [None, "wrong", "s3cret-but-longer"])
def test_calls_without_the_right_token_are_refused(server_address, token):
    channel = (
        grpc.insecure_channel(server_address)
        if token is None
        else open_channel(server_address, token, "master")
    )
    with pytest.raises(grpc.RpcError) as refused:
        rpc.MasterStub(channel).GetStatus(pb.Empty(), timeout=5)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_generated_stubs_match_the_proto():
    # In a child process: grpc_tools' protoc and TensorFlow's protobuf do not share a
    # process (importing TensorFlow after grpc_tools crashes it).
    check = subprocess.run(
        [sys.executable, "-m", "elasticdl_nb.runtime.protocol.generate", "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 0, check.stdout + check.stderr
