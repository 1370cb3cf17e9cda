"""How the client registers CUDA memory, with a fake driver (no GPU here):
legacy IPC or a VMM descriptor as the driver says, the export's cleanup on
every path, and the VMM registration through the fd channel of a real
(CPU) server, which refuses it precisely."""
import contextlib
import ctypes
import os

import grpc
import pytest

import tokensel
from tokensel import cuda_vmm, fd_channel
from tokensel.v1 import tokensel_pb2 as pb

UUID = "GPU-00000000-0000-0000-0000-00000000000a"
MIB = 1 << 20


class FakeDriver:
    """The methods tokensel.cuda_vmm uses. Allocations mapped back to back from
    `base` (sizes `chunks`, handles 42, 43, ...; default one of `extent`
    bytes) on device 0; counts retained handles and exported descriptors;
    fails the call named in `fail` (its `fail_at`-th call, from 0)."""

    def __init__(self, legacy=False, base=0x7f0000000000, extent=20 * MIB, fail=None,
                 posix_fd=True, pool=0, chunks=None, fail_at=0):
        self.legacy, self.base, self.fail, self.fail_at = legacy, base, fail, fail_at
        self.chunks = list(chunks) if chunks else [extent]
        self.extent = self.chunks[0]
        self.posix_fd, self.pool = posix_fd, pool
        self.range_extent = None
        self.retained = 0
        self.exported = []
        self.calls = []

    def _enter(self, name):
        self.calls.append(name)
        if self.fail == name and self.calls.count(name) == self.fail_at + 1:
            raise cuda_vmm.DriverError(name, 1)

    def _chunk(self, address):
        """(handle, base, size) of the allocation mapped at `address`."""
        start = self.base
        for i, size in enumerate(self.chunks):
            if start <= address < start + size:
                return 42 + i, start, size
            start += size
        raise cuda_vmm.DriverError("not mapped", 1)  # CUDA_ERROR_INVALID_VALUE

    def legacy_ipc_capable(self, address):
        self._enter("legacy_ipc_capable")
        return self.legacy

    def allows_posix_fd(self, address):
        self._enter("allows_posix_fd")
        return self.posix_fd

    def device_ordinal(self, address):
        self._enter("device_ordinal")
        return 0

    def mempool(self, address):
        self._enter("mempool")
        return self.pool

    @contextlib.contextmanager
    def context(self, ordinal):
        assert ordinal == 0
        self._enter("push")
        try:
            yield
        finally:
            self._enter("pop")

    def device_uuid(self, ordinal):
        self._enter("device_uuid")
        return UUID

    def retain_allocation_handle(self, address):
        self._enter("retain")
        handle = self._chunk(address)[0]
        self.retained += 1
        return handle

    def address_range(self, address):
        # The reported range may be wider (`range_extent`), as a reservation
        # holding several allocations is.
        self._enter("address_range")
        _, base, size = self._chunk(address)
        return base, self.range_extent or size

    def export_fd(self, handle):
        self._enter("export_fd")
        fd = os.memfd_create("fake-vmm-%d" % handle, os.MFD_CLOEXEC)
        self.exported.append(fd)
        return fd

    def release(self, handle):
        assert 42 <= handle < 42 + len(self.chunks) and self.retained > 0
        self.retained -= 1
        self._enter("release")

    def ipc_mem_handle(self, address):
        self._enter("ipc_mem_handle")
        return b"h" * 64


def is_open(fd):
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


@pytest.fixture
def vmm_client(client):
    """`client`, believing the server takes cuda_vmm (the CPU test server does
    not): the descriptors and the registration then reach it."""
    client.server_info.memory_kinds.append("cuda_vmm")
    yield client
    client.server_info.memory_kinds.remove("cuda_vmm")


def test_plan_follows_the_legacy_ipc_attribute():
    assert cuda_vmm.plan(FakeDriver(legacy=True), 0x1000) == cuda_vmm.LEGACY_IPC
    assert cuda_vmm.plan(FakeDriver(legacy=False), 0x1000) == cuda_vmm.VMM


def test_export_gives_the_offset_in_the_allocation_and_releases_the_handle():
    drv = FakeDriver()
    spec = cuda_vmm.export(drv, drv.base + 3 * MIB + 256, 4 * MIB)
    try:
        assert spec.offset == 3 * MIB + 256
        assert spec.size == 4 * MIB
        assert spec.allocation_sizes == (drv.extent,)  # the server maps it whole
        assert spec.device_uuid == UUID and spec.device == "cuda:0"
        assert spec.fds == (drv.exported[0],) and is_open(spec.fds[0])
        assert drv.retained == 0
    finally:
        os.close(spec.fds[0])
    # Exactly up to the allocation's end is fine.
    spec = cuda_vmm.export(drv, drv.base + MIB, drv.extent - MIB)
    assert len(spec.fds) == 1
    os.close(spec.fds[0])
    assert drv.retained == 0


@pytest.mark.parametrize("offset,size", [(19 * MIB, 2 * MIB), (0, 20 * MIB + 1), (-1, 16)])
def test_memory_past_the_mapped_allocations_is_refused_and_leaks_nothing(offset, size):
    drv = FakeDriver()
    with pytest.raises(tokensel.CudaUnavailableError):
        cuda_vmm.export(drv, drv.base + offset, size)
    assert drv.retained == 0
    assert all(not is_open(fd) for fd in drv.exported)


@pytest.mark.parametrize("step", ["address_range", "export_fd", "release"])
def test_a_failing_step_leaks_neither_handle_nor_descriptor(step):
    drv = FakeDriver(fail=step)
    with pytest.raises(cuda_vmm.DriverError, match=step):
        cuda_vmm.export(drv, drv.base, MIB)
    assert drv.retained == 0
    assert all(not is_open(fd) for fd in drv.exported)
    # Every retained handle is released once, whichever step failed.
    assert drv.calls.count("release") == drv.calls.count("retain")


def test_memory_that_cannot_be_exported_as_a_descriptor_is_refused_first():
    drv = FakeDriver(posix_fd=False)
    with pytest.raises(tokensel.CudaUnavailableError, match="POSIX file descriptor"):
        cuda_vmm.export(drv, drv.base, MIB)
    assert drv.calls == ["mempool", "allows_posix_fd"]


@pytest.mark.parametrize("posix_fd", [True, False])
def test_pool_memory_is_refused_before_any_handle_is_retained(posix_fd):
    # cuMemRetainAllocationHandle on cudaMallocAsync memory may give the
    # pool's chunk while the address range is the sub-allocation: the offset
    # would be wrong, so pool memory is refused even when exportable.
    drv = FakeDriver(pool=0x5000, posix_fd=posix_fd)
    with pytest.raises(tokensel.CudaUnavailableError, match="memory pool.*cuMemPoolExportPointer"):
        cuda_vmm.export(drv, drv.base, MIB)
    assert drv.calls == ["mempool"]
    assert drv.exported == [] and drv.retained == 0


def test_a_reported_range_wider_than_the_allocation_is_refused():
    drv = FakeDriver()
    drv = FakeDriver(chunks=[20 * MIB, 20 * MIB])
    drv.range_extent = 40 * MIB  # e.g. the whole reservation of expandable segments
    with pytest.raises(tokensel.CudaUnavailableError, match="is not one CUDA allocation"):
        cuda_vmm.export(drv, drv.base + MIB, MIB)
    assert drv.exported == [] and drv.retained == 0


def test_a_failing_query_retains_nothing():
    for step in ("mempool", "allows_posix_fd", "device_ordinal", "device_uuid", "retain"):
        drv = FakeDriver(fail=step)
        with pytest.raises(cuda_vmm.DriverError):
            cuda_vmm.export(drv, drv.base, MIB)
        assert drv.retained == 0 and drv.exported == []


def test_no_driver_library_is_a_clean_error():
    with pytest.raises(tokensel.CudaUnavailableError, match="CUDA driver"):
        cuda_vmm.LibcudaDriver("libtokensel-no-such-driver.so.1")


def test_a_server_without_the_kind_is_refused_before_any_export(client):
    assert "cuda_vmm" not in client.server_info.memory_kinds  # the CPU test server
    drv = FakeDriver()
    with pytest.raises(tokensel.CudaUnavailableError, match="does not accept cuda_vmm"):
        client.register_cuda_pointer(drv.base, MIB, driver=drv)
    assert drv.exported == [] and drv.retained == 0
    legacy = FakeDriver(legacy=True)
    with pytest.raises(tokensel.CudaUnavailableError, match="does not accept cuda_ipc"):
        client.register_cuda_pointer(legacy.base, MIB, driver=legacy)
    assert "ipc_mem_handle" not in legacy.calls
    assert client.list_buffers() == []


def test_vmm_descriptors_go_over_the_fd_channel_and_are_refused_precisely(client):
    # Make the client believe the server takes cuda_vmm: the descriptor and
    # the registration then reach the server, which (no device, CPU backend)
    # refuses the descriptor on arrival, naming why.
    client.server_info.memory_kinds.append("cuda_vmm")
    try:
        drv = FakeDriver()
        with pytest.raises(tokensel.FailedPreconditionError) as info:
            client.register_cuda_pointer(drv.base + MIB, 2 * MIB, driver=drv)
        assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert "cuda_vmm: " in info.value.message
        assert drv.retained == 0
        assert len(drv.exported) == 1 and not is_open(drv.exported[0])
        assert client.list_buffers() == []
    finally:
        client.server_info.memory_kinds.remove("cuda_vmm")


class FakeLibcuda:
    """Stands in for the ctypes CDLL of libcuda.so.1: each function records
    its call and answers through the ctypes objects it was passed (byref
    arguments expose them as `_obj`), so LibcudaDriver's argument types are
    checked without a driver. Functions in `missing` do not exist."""

    def __init__(self, answers=None, missing=()):
        self.answers = answers or {}
        self.missing = set(missing)
        self.calls = []

    def __getattr__(self, name):
        if name.startswith("_") or name in self.missing:
            raise AttributeError(name)
        lib = self

        class Fn:
            restype = None

            def __call__(self, *args):
                lib.calls.append(name)
                answer = lib.answers.get(name)
                return answer(*args) if answer else 0

        return Fn()


def libcuda_driver(fake):
    drv = cuda_vmm.LibcudaDriver.__new__(cuda_vmm.LibcudaDriver)
    drv._cuda = fake
    return drv


def test_pointer_attributes_are_read_into_a_zeroed_64_bit_word():
    pool = 0x7f00_1234_5678
    seen = []

    def get_attribute(out, attribute, address):
        seen.append(type(out._obj))
        assert out._obj.value == 0  # zeroed: a narrower answer leaves no garbage
        out._obj.value = {17: pool, 9: 3, 10: 1, 14: 1}[attribute.value]
        return 0

    drv = libcuda_driver(FakeLibcuda({"cuPointerGetAttribute": get_attribute}))
    assert drv.mempool(0x1000) == pool
    assert drv.device_ordinal(0x1000) == 3
    assert drv.legacy_ipc_capable(0x1000) and drv.allows_posix_fd(0x1000)
    assert seen == [ctypes.c_uint64] * 4


def test_address_range_has_no_32_bit_fallback():
    fake = FakeLibcuda(missing=["cuMemGetAddressRange_v2"])
    with pytest.raises(tokensel.CudaUnavailableError, match="lacks cuMemGetAddressRange_v2"):
        libcuda_driver(fake).address_range(0x7f0000000000)
    assert fake.calls == []  # the 32-bit cuMemGetAddressRange was not called


def test_the_calls_that_need_a_context_run_inside_the_devices_context():
    drv = FakeDriver()
    spec = cuda_vmm.export(drv, drv.base + MIB, MIB)
    os.close(spec.fds[0])
    inside = drv.calls[drv.calls.index("push") + 1:drv.calls.index("pop")]
    assert drv.calls[:drv.calls.index("push")] == [
        "mempool", "allows_posix_fd", "device_ordinal", "device_uuid"]
    assert drv.calls[drv.calls.index("pop") + 1:] == []
    assert inside[0] == "retain" and "address_range" in inside and "export_fd" in inside
    assert inside[-1] == "release" and drv.calls.count("push") == 1

    legacy = FakeDriver(legacy=True)
    cuda_vmm.export_legacy(legacy, legacy.base + MIB, MIB)
    assert legacy.calls == ["device_ordinal", "push", "address_range", "ipc_mem_handle", "pop",
                            "device_uuid"]


def test_a_failing_pop_closes_the_exported_descriptor():
    drv = FakeDriver(fail="pop")
    with pytest.raises(cuda_vmm.DriverError, match="pop"):
        cuda_vmm.export(drv, drv.base, MIB)
    assert drv.retained == 0 and len(drv.exported) == 1 and not is_open(drv.exported[0])


@pytest.mark.parametrize("fail", [None, "cuCtxPushCurrent_v2", "inside"])
def test_libcuda_context_pushes_the_primary_context_and_always_releases_it(fail):
    answers = {}
    if fail == "cuCtxPushCurrent_v2":
        answers[fail] = lambda *args: 201
    fake = FakeLibcuda(answers)
    drv = libcuda_driver(fake)
    try:
        with drv.context(0):
            fake.calls.append("body")
            if fail == "inside":
                raise cuda_vmm.DriverError("body", 1)
    except cuda_vmm.DriverError:
        assert fail is not None
    if fail == "cuCtxPushCurrent_v2":
        assert fake.calls == ["cuDeviceGet", "cuDevicePrimaryCtxRetain", "cuCtxPushCurrent_v2",
                              "cuDevicePrimaryCtxRelease_v2"]
    else:
        assert fake.calls == ["cuDeviceGet", "cuDevicePrimaryCtxRetain", "cuCtxPushCurrent_v2",
                              "body", "cuCtxPopCurrent_v2", "cuDevicePrimaryCtxRelease_v2"]


def test_the_registration_states_the_allocations_size(client, monkeypatch):
    # What RegisterBuffer carries: offset, size, device and the allocation's
    # size (the server maps the allocation whole, as some drivers require).
    sent = []

    def capture(name, request, *args, **kwargs):
        sent.append(request)
        raise tokensel.CudaUnavailableError("captured")

    monkeypatch.setattr(client, "_register", capture)
    client.server_info.memory_kinds.append("cuda_vmm")
    drv = FakeDriver()
    try:
        with pytest.raises(tokensel.CudaUnavailableError, match="captured"):
            client.register_cuda_pointer(drv.base + MIB, 2 * MIB, driver=drv)
    finally:
        client.server_info.memory_kinds.remove("cuda_vmm")
    passed = sent[0].fd
    assert (passed.offset, passed.size, passed.device_uuid, passed.allocation_size) == (
        MIB, 2 * MIB, UUID, drv.extent)
    assert list(passed.segments) == []  # one allocation: the single form
    assert len(drv.exported) == 1 and not is_open(drv.exported[0])


# ------------------------------------------------- several allocations --
# PyTorch's expandable_segments maps a segment as consecutive chunks, each
# its own cuMemCreate allocation: a large tensor spans several.

CHUNKS = [20 * MIB, 20 * MIB, 20 * MIB, 2 * MIB]


def test_a_tensor_spanning_three_chunks_gives_three_descriptors_in_order():
    drv = FakeDriver(chunks=CHUNKS)
    address, size = drv.base + 5 * MIB + 12, 50 * MIB  # ends inside the third chunk
    spec = cuda_vmm.export(drv, address, size)
    try:
        assert spec.fds == tuple(drv.exported) and len(spec.fds) == 3
        # In address order: each exported from the handle of its chunk.
        assert [os.readlink("/proc/self/fd/%d" % fd).split("fake-vmm-")[1][:2]
                for fd in spec.fds] == ["42", "43", "44"]
        assert spec.allocation_sizes == (20 * MIB, 20 * MIB, 20 * MIB)
        assert spec.offset == 5 * MIB + 12 and spec.size == size
        assert all(is_open(fd) for fd in spec.fds)
        assert drv.retained == 0
        assert drv.calls.count("retain") == drv.calls.count("release")
    finally:
        for fd in spec.fds:
            os.close(fd)
    # Exactly to the end of the last chunk, and one chunk exactly.
    spec = cuda_vmm.export(drv, drv.base, sum(CHUNKS))
    assert spec.allocation_sizes == tuple(CHUNKS) and spec.offset == 0
    for fd in spec.fds:
        os.close(fd)
    spec = cuda_vmm.export(drv, drv.base + 20 * MIB, 20 * MIB)
    assert spec.allocation_sizes == (20 * MIB,) and spec.offset == 0
    os.close(spec.fds[0])


@pytest.mark.parametrize("step,at", [("retain", 3), ("address_range", 1), ("export_fd", 1),
                                     ("export_fd", 2), ("release", 4), ("pop", 0)])
def test_a_failure_in_the_middle_closes_the_descriptors_already_exported(step, at):
    drv = FakeDriver(chunks=CHUNKS, fail=step, fail_at=at)
    with pytest.raises(cuda_vmm.DriverError, match=step):
        cuda_vmm.export(drv, drv.base + MIB, 50 * MIB)
    assert drv.exported  # something was exported before the failure
    assert all(not is_open(fd) for fd in drv.exported)
    assert drv.retained == 0


def test_a_gap_or_an_overlap_between_allocations_is_refused():
    drv = FakeDriver(chunks=CHUNKS)
    real = drv.address_range
    # The second allocation reported as starting before the cursor.
    drv.address_range = lambda a: (lambda r: (r[0] - (MIB if a != drv.base + MIB and
                                                      r[0] != drv.base else 0), r[1]))(real(a))
    with pytest.raises(tokensel.CudaUnavailableError, match="cannot be registered by descriptor"):
        cuda_vmm.export(drv, drv.base + MIB, 30 * MIB)
    assert all(not is_open(fd) for fd in drv.exported) and drv.retained == 0


def test_more_allocations_than_the_limit_are_refused_before_exporting_more(monkeypatch):
    monkeypatch.setattr(cuda_vmm, "MAX_SEGMENTS", 3)
    drv = FakeDriver(chunks=[2 * MIB] * 5)
    with pytest.raises(tokensel.CudaUnavailableError, match="more than 3 CUDA allocations"):
        cuda_vmm.export(drv, drv.base, 6 * MIB + 1)
    assert len(drv.exported) == 3 and all(not is_open(fd) for fd in drv.exported)
    assert drv.retained == 0
    spec = cuda_vmm.export(drv, drv.base, 6 * MIB)  # exactly the limit
    assert len(spec.fds) == 3
    for fd in spec.fds:
        os.close(fd)


def test_the_registration_of_several_allocations_carries_ordered_segments(vmm_client,
                                                                         monkeypatch):
    # Through the fd channel of the real (CPU) server: every descriptor gets
    # its own ticket, in order, and the server refuses them on arrival; the
    # client then closes all of them.
    sent = []
    real_send = fd_channel.send_fd

    def spy(channel, session, fd, **kwargs):
        sent.append(fd)
        return real_send(channel, session, fd, **kwargs)

    monkeypatch.setattr(fd_channel, "send_fd", spy)
    drv = FakeDriver(chunks=CHUNKS)
    with pytest.raises(tokensel.FailedPreconditionError, match="cuda_vmm: "):
        vmm_client.register_cuda_pointer(drv.base + MIB, 50 * MIB, driver=drv)
    assert sent == drv.exported[:1]  # refused at the first descriptor
    assert len(drv.exported) == 3 and all(not is_open(fd) for fd in drv.exported)
    assert vmm_client.list_buffers() == []


def test_the_request_lists_the_segments_in_order(vmm_client, monkeypatch):
    sent = []

    def capture(name, request, address, size, device, owner, fd=None):
        sent.append((request, fd))
        raise tokensel.CudaUnavailableError("captured")

    monkeypatch.setattr(vmm_client, "_register", capture)
    drv = FakeDriver(chunks=CHUNKS)
    with pytest.raises(tokensel.CudaUnavailableError, match="captured"):
        vmm_client.register_cuda_pointer(drv.base + MIB, 45 * MIB, driver=drv)
    request, fds = sent[0]
    passed = request.fd
    assert (passed.offset, passed.size, passed.device_uuid) == (MIB, 45 * MIB, UUID)
    assert passed.ticket == "" and passed.allocation_size == 0  # superseded
    assert [s.allocation_size for s in passed.segments] == [20 * MIB] * 3
    assert fds == tuple(drv.exported)
    assert all(not is_open(fd) for fd in drv.exported)


def test_with_ticket_fills_one_ticket_per_segment_in_order(client, monkeypatch):
    tickets = iter(["t0", "t1", "t2"])
    seen = []

    def fake_send(channel, session, fd, kind=None, timeout=None):
        seen.append((fd, kind))
        return pb.FdChannelReply(ticket=next(tickets))

    monkeypatch.setattr(fd_channel, "send_fd", fake_send)
    request = pb.RegisterBufferRequest(name="x", fd=pb.PassedFd(
        offset=1, size=2, device_uuid=UUID,
        segments=[pb.VmmSegment(allocation_size=20 * MIB) for _ in range(3)]))
    ticketed = client._with_ticket(request, (7, 8, 9))
    assert [s.ticket for s in ticketed.fd.segments] == ["t0", "t1", "t2"]
    assert ticketed.fd.ticket == ""
    assert seen == [(7, pb.FD_KIND_CUDA_VMM), (8, pb.FD_KIND_CUDA_VMM), (9, pb.FD_KIND_CUDA_VMM)]
    assert [s.ticket for s in request.fd.segments] == ["", "", ""]  # the stored one unchanged
