"""On a device (marked `gpu`; skips without torch CUDA or a CUDA server): a
torch tensor allocated with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
that spans at least 3 physical chunks is registered as one VMM buffer of
several allocations (PassedFd.segments), and GatherTokens on it matches the
CPU formula out[b, r, :] = act[b, idx[b, r], :].

The allocator setting must be in place before CUDA is initialised, so the
work runs in a child Python process (this one may have initialised CUDA
already). Not run here: this machine has no GPU."""
import os
import subprocess
import sys
import textwrap

import pytest

try:
    import torch
except ImportError:
    torch = None

pytestmark = pytest.mark.gpu

CHILD = textwrap.dedent("""
    import os, sys
    import torch
    import tokensel
    from tokensel import cuda_vmm

    B, S, C, R = 2, 4096, 2048, 777  # activations: 64 MiB of float32
    torch.manual_seed(7)
    act = torch.randn(B, S, C, device="cuda")
    idx = torch.randint(0, S, (B, R), device="cuda", dtype=torch.int64)
    out = torch.empty(B, R, C, device="cuda")
    torch.cuda.synchronize()
    drv = cuda_vmm.driver()
    address = act.untyped_storage().data_ptr()
    nbytes = act.untyped_storage().nbytes()
    assert not drv.legacy_ipc_capable(address), "expandable_segments did not take effect"
    spec = cuda_vmm.export(drv, address, nbytes)
    for fd in spec.fds:
        os.close(fd)
    assert len(spec.fds) >= 3, "the tensor spans %d allocations" % len(spec.fds)
    with tokensel.Client(sys.argv[1], client_name="vmm-gpu") as client:
        with client.register_cuda(act) as a, client.register_cuda(idx), \\
                client.register_cuda(out):
            assert a.kind == "cuda_vmm"
            infos = {b.name: b for b in client.list_buffers()}
            assert infos[a.name].size == nbytes
            client.gather_tokens(act, idx, out=out)
            torch.cuda.synchronize()
    expect = act.cpu()[torch.arange(B)[:, None], idx.cpu()]
    assert torch.equal(out.cpu(), expect), "gather differs from the CPU formula"
    print("OK", len(spec.fds))
""")


def test_an_expandable_segments_tensor_of_several_chunks_gathers_right(server):
    if torch is None or not torch.cuda.is_available():
        pytest.skip("needs torch with a CUDA device")
    with tokensel_client(server) as client:
        if "cuda_vmm" not in client.server_info.memory_kinds:
            pytest.skip("the server does not map cuda_vmm memory (backend %s)"
                        % client.server_info.backend)
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    done = subprocess.run([sys.executable, "-c", CHILD, server.target], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("OK ")


def tokensel_client(server):
    import tokensel
    return tokensel.Client(server.target, client_name="pytest-gpu")
