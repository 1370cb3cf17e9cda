"""What the package promises about its dependencies: it imports and runs
without torch and cuda-bindings, and its descriptor-made messages and stub
cover the whole service, streaming included, on whichever grpcio/protobuf
this venv has (scripts/install-pyclient-ends.sh runs this at both ends)."""
import subprocess
import sys

import grpc
import numpy as np

import tokensel
from tokensel.v1 import tokensel_pb2 as pb
from tokensel.v1 import tokensel_pb2_grpc as pb_grpc

# `None` in sys.modules makes `import torch` (and `from cuda.bindings import
# driver`) raise ImportError even where they are installed.
WITHOUT_TORCH_OR_CUDA = """
import sys
sys.modules.update({"torch": None, "cuda": None})
import numpy as np
import tokensel
with tokensel.Client(sys.argv[1]) as client:
    act = np.arange(12, dtype=np.float32).reshape(1, 6, 2)
    assert client.gather_tokens(act, [[5, 0]]).tolist() == [[[10, 11], [0, 1]]]
    with client.shared_buffer(4096) as buf:
        view = buf.numpy(np.float32, (1, 6, 2))
        view[:] = act
        client.scatter_tokens(view, np.zeros((1, 1, 2), np.float32), [[3]])
        assert view[0, 3].tolist() == [0, 0] and view[0, 4].tolist() == [8, 9]
    try:
        client.register_cuda(act)
        raise AssertionError("register_cuda worked without cuda-bindings")
    except tokensel.CudaUnavailableError as err:
        assert "cuda-bindings" in err.message, err.message
print("ok", sorted(m for m in ("torch", "cuda") if sys.modules.get(m) is not None))
"""


def test_imports_and_runs_without_torch_or_cuda_bindings(server):
    run = subprocess.run([sys.executable, "-c", WITHOUT_TORCH_OR_CUDA, server.target],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    out = run.stdout.decode(errors="replace")
    assert run.returncode == 0, out
    assert out.strip().splitlines()[-1] == "ok []"


def test_imports_without_warnings():
    # A deprecation in the protobuf or grpcio runtime that tokensel_pb2 or
    # tokensel_pb2_grpc relies on shows up here first.
    run = subprocess.run([sys.executable, "-W", "error", "-c",
                          "import tokensel, tokensel.v1.tokensel_pb2_grpc"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    assert run.returncode == 0, run.stdout.decode(errors="replace")


def test_messages_round_trip_with_enums_and_oneofs():
    request = pb.GatherTokensRequest()
    request.activations.dtype = pb.DTYPE_BFLOAT16
    request.activations.shape.extend([2, 3])
    request.activations.buffer.buffer = "b"
    copy = pb.GatherTokensRequest.FromString(request.SerializeToString())
    assert copy == request
    assert copy.activations.WhichOneof("data") == "buffer"
    assert pb.DType.Name(copy.activations.dtype) == "DTYPE_BFLOAT16"
    assert pb.DESCRIPTOR.package == "tokensel.v1"


def test_the_stub_has_every_rpc_and_streams(client):
    stub = pb_grpc.TokenSelectStub(grpc.insecure_channel(client.target))
    methods = [m.name for m in pb.DESCRIPTOR.services_by_name["TokenSelect"].methods]
    assert "Stream" in methods and "GatherTokens" in methods
    assert all(callable(getattr(stub, m)) for m in methods)
    # Stream is the one bidirectional RPC (stream_stream on the channel).
    prepared = client.ops.topk_tokens(np.array([[3, 1, 4, 1, 5]], np.float32), 2)
    requests = [pb.StreamRequest(request_id=7 + i, op=pb.Op(top_k_tokens=prepared.request))
                for i in range(2)]
    responses = list(stub.Stream(iter(requests), timeout=30,
                                 metadata=((tokensel.SESSION_KEY, client.session_id),)))
    assert [(r.request_id, r.code, r.message) for r in responses] == [(7, 0, ""), (8, 0, "")]
    assert [prepared.finish(r.op).tolist() for r in responses] == [[[2, 4]], [[2, 4]]]
