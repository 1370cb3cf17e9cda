"""tokensel.Client: a session with a tokensel server.

    with tokensel.Client("unix:///run/tokensel/tokensel.sock") as client:
        with client.shared_buffer(1 << 20) as buf:
            acts = buf.numpy(np.float32, (8, 512, 64))
            ...
            part = client.gather_tokens(acts, ids)        # numpy [8, R, 64]

Opening the client opens a session ("tokensel-session" metadata on every
call) and starts a daemon thread that renews its lease every lease/3;
close() (or leaving the `with`) closes the buffers it created and the
session. Every failure raises a tokensel.TokenselError subclass carrying the
gRPC status code. Calls are thread-safe; create and close buffers from any
thread, but not concurrently with close().

Recovery: when the server restarts (or the lease lapsed) the session is gone
and KeepAlive answers NOT_FOUND. With auto_reopen (the default) the keep-alive
thread then opens a new session and re-registers every buffer this client
registered (same names, same shm objects / CUDA allocations), so buffers and
views stay usable; while the server is unreachable it retries every
min(lease/3, 1 s). Calls made during the gap raise UnavailableError (server
down) or NotFoundError (old session id); retry them after
wait_reopened(). reopen() does the same on demand.

A secured TCP listener (the server's --tls_cert/--tls_key/--auth_token_file):

    with tokensel.Client("10.0.0.5:50051", tls_ca="ca.pem",
                         auth_token=open("token").read().strip()) as client:
        client.ping()

A wrong CA raises TlsHandshakeError (an UnavailableError), no token
UnauthenticatedError, a wrong token PermissionDeniedError; see
tokensel.credentials for which target gets TLS.
"""
import collections
import functools
import os
import threading

import grpc

from tokensel import credentials as credentials_module
from tokensel import cuda_ipc, cuda_vmm, errors, shm
from tokensel import fd_channel as fd_channel_module
from tokensel.ops import OP_NAMES, OpBuilder
from tokensel.stream import Stream
from tokensel.tensors import TransferStats, as_array, layout_of
from tokensel.v1 import tokensel_pb2 as pb
from tokensel.v1 import tokensel_pb2_grpc as pb_grpc

SESSION_KEY = "tokensel-session"

# A registered buffer: where it is mapped here, and how to register it again
# (`fd`: the descriptor sent on the fd channel before each registration).
_Region = collections.namedtuple("_Region", "address size device owner request fd")


class Client:
    """A session with one server. `target`: "unix:///path", "host:port" or
    "https://host:port". `timeout`: default deadline (seconds) of every call;
    `lease_ttl`: requested session lease in seconds (None = the server
    default); `fd_channel`: the server's fd channel (default: derived from a
    unix target), through which shared memory is registered.

    TCP security (any of these turns TLS on): `tls_ca`, the CA bundle that
    signed the server's certificate (a path, or PEM bytes; None = the system
    roots); `server_name`, the name the certificate must carry when it is
    not the target's host; `auth_token`, the server's bearer token (str);
    `credentials`, a grpc.ChannelCredentials used instead of tls_ca;
    `tls=True` for the system roots alone, `tls=False` for plaintext."""

    def __init__(self, target="unix:///run/tokensel/tokensel.sock", *,
                 client_name="tokensel-python",
                 timeout=30.0, lease_ttl=None, max_message_bytes=64 << 20, keepalive=True,
                 auto_reopen=True, fd_channel=None, tls=None, tls_ca=None, server_name=None,
                 auth_token=None, credentials=None):
        self._security = credentials_module.Security(
            target, tls=tls, tls_ca=tls_ca, server_name=server_name, auth_token=auth_token,
            credentials=credentials)
        self.target = target
        self.fd_channel = fd_channel or fd_channel_module.channel_path(target)
        self.timeout = timeout
        self.auto_reopen = auto_reopen
        self._client_name = client_name
        self._requested_lease_ms = int((lease_ttl or 0) * 1000)
        options = [("grpc.max_send_message_length", max_message_bytes),
                   ("grpc.max_receive_message_length", max_message_bytes),
                   # Reconnect promptly after a server restart (gRPC's default
                   # backoff grows to 120 s).
                   ("grpc.initial_reconnect_backoff_ms", 100),
                   ("grpc.max_reconnect_backoff_ms", 5000)]
        self._channel = self._security.channel(options)
        self._stub = pb_grpc.TokenSelectStub(self._channel)
        self._lock = threading.Lock()
        # buffer name -> _Region(address, size, device, owner, request)
        self._regions = {}
        # Events passed to execute(): kept alive until the session's next
        # barrier (execute([]) without events) or close, since the server's
        # streams may still wait on or record them.
        self._held_events = []
        self._stop = threading.Event()
        self._reopened = threading.Condition()
        self.reopen_count = 0  # sessions re-opened (guarded by _reopened)
        self._keepalive_thread = None
        self.keepalive_error = None  # last KeepAlive failure, if any
        self.session_id = None
        # Bytes staged inline vs tensors passed by reference (tensors.TransferStats).
        self.stats = TransferStats()
        self.ops = OpBuilder(self._find_region, self.stats)
        try:
            self.server_info = self.call("GetServerInfo", pb.GetServerInfoRequest(), session=False)
            opened = self._open_session()
        except BaseException:
            self._channel.close()
            raise
        self.session_id = opened.session_id
        self.lease_ttl = opened.lease_ttl_ms / 1000.0
        if keepalive:
            self._keepalive_thread = threading.Thread(
                target=self._keepalive_loop, name="tokensel-keepalive", daemon=True)
            self._keepalive_thread.start()

    # ------------------------------------------------------------ plumbing --

    def call(self, method, request, *, session=True, timeout=None):
        """Raw unary RPC `method` ("ListBuffers", ...) with the session
        metadata (session=False: without); raises TokenselError. For requests
        the typed methods do not cover."""
        metadata = ((SESSION_KEY, self.session_id),) if session else None
        if session and self.session_id is None:
            raise errors.FailedPreconditionError("the client is closed")
        try:
            return getattr(self._stub, method)(
                request, timeout=self.timeout if timeout is None else timeout, metadata=metadata)
        except grpc.RpcError as err:
            raise self._explain(err) from None

    def _explain(self, rpc_error):
        """The TokenselError for a grpc.RpcError of this channel."""
        return self._security.explain(errors.from_rpc_error(rpc_error))

    def _open_stream(self, requests, timeout):
        """A Stream call with this session, fed from the iterator `requests`."""
        return self._stub.Stream(requests, timeout=timeout,
                                 metadata=((SESSION_KEY, self.session_id),))

    def _open_session(self):
        return self.call("OpenSession", pb.OpenSessionRequest(
            client_name=self._client_name, lease_ttl_ms=self._requested_lease_ms), session=False)

    def _keepalive_loop(self):
        interval = max(self.lease_ttl / 3.0, 0.05)
        wait = interval
        while not self._stop.wait(wait):
            try:
                self.call("KeepAlive", pb.KeepAliveRequest(), timeout=interval)
                self.keepalive_error = None
                wait = interval
                continue
            except errors.NotFoundError as err:  # the session is gone (restart or lapse)
                self.keepalive_error = err
                if not self.auto_reopen:
                    return
            except errors.TokenselError as err:  # server unreachable: retry soon
                self.keepalive_error = err
                wait = min(interval, 1.0)
                continue
            try:
                self.reopen()
                self.keepalive_error = None
                wait = interval
            except errors.TokenselError as err:
                self.keepalive_error = err
                wait = min(interval, 1.0)

    def reopen(self):
        """Opens a new session and re-registers this client's buffers under
        their names (the old session, if it still exists, is left to its
        lease). Called by the keep-alive thread when the session is gone;
        raises the first failure (the next attempt starts over)."""
        if self.session_id is None:
            raise errors.FailedPreconditionError("the client is closed")
        opened = self._open_session()
        with self._lock:
            self.session_id = opened.session_id
            self.lease_ttl = opened.lease_ttl_ms / 1000.0
            regions = list(self._regions.values())
        for region in regions:
            name = region.request.name
            try:
                self.call("RegisterBuffer", self._with_ticket(region.request, region.fd))
            except errors.AlreadyExistsError:  # registered meanwhile by _register
                continue
            with self._lock:
                closed_meanwhile = name not in self._regions
            if closed_meanwhile:  # its close() unregistered before we re-registered
                self.call("UnregisterBuffer", pb.UnregisterBufferRequest(name=name))
        with self._reopened:
            self.reopen_count += 1
            self._reopened.notify_all()

    def wait_reopened(self, count=1, timeout=None):
        """Waits until at least `count` re-opens happened (reopen_count);
        returns whether they did within `timeout` seconds."""
        with self._reopened:
            return self._reopened.wait_for(lambda: self.reopen_count >= count, timeout)

    def _find_region(self, address, extent, device):
        with self._lock:
            for name, region in self._regions.items():
                base = region.address
                if (device == region.device and base <= address
                        and address + extent <= base + region.size):
                    return name, base
        return None

    # ------------------------------------------------------------- session --

    def ping(self):
        """The null RPC (no session)."""
        self.call("Ping", pb.PingRequest(), session=False)

    def keep_alive(self):
        """Renews the lease now; returns the lease in seconds."""
        return self.call("KeepAlive", pb.KeepAliveRequest()).lease_ttl_ms / 1000.0

    def close(self):
        """Closes the buffers this client created, then the session and the
        channel. Idempotent. Raises the first error after cleaning up."""
        if self.session_id is None:
            return
        self._stop.set()
        if self._keepalive_thread is not None:
            self._keepalive_thread.join()
        first_error = None
        if self._held_events:
            # The session's async work may still wait on or record these
            # events: let it complete before they can be destroyed.
            try:
                self.execute([])
            except errors.TokenselError as err:
                first_error = err
        for region in list(self._regions.values()):
            try:
                region.owner.close()
            except errors.TokenselError as err:
                first_error = first_error or err
        try:
            self.call("CloseSession", pb.CloseSessionRequest())
        except errors.TokenselError as err:
            first_error = first_error or err
        finally:
            self._held_events.clear()
            self.session_id = None
            self._channel.close()
        if first_error is not None:
            raise first_error

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------- buffers --

    def shared_buffer(self, nbytes, *, name=None):
        """Creates shared memory of `nbytes` (a sealed memfd: it cannot
        shrink under the server, and no other process can open it), maps it
        and registers it as `name` (default: a unique "py-<pid>-<n>") by
        handing its descriptor to the server. Needs a unix socket target.
        Returns a SharedBuffer (a context manager)."""
        label = shm.unique_label()
        region = shm.ShmRegion(label, int(nbytes))
        name = name or label
        buf = shm.SharedBuffer(self, region, name)
        try:
            self._register(name, pb.RegisterBufferRequest(
                name=name, fd=pb.PassedFd(offset=0, size=region.size)),
                region.address, region.size, "cpu", buf, fd=region.fd)
        except BaseException:
            region.close()
            raise
        return buf

    def register_cuda(self, tensor, *, name=None, driver=None):
        """Registers the memory of a CUDA torch tensor's storage. Memory
        cudaIpcGetMemHandle can export goes by CUDA IPC (handle of its
        allocation's base + offset); VMM memory (cuMemCreate, PyTorch's
        expandable_segments) by descriptor on the fd channel
        (tokensel.cuda_vmm). Stream-ordered pool memory (cudaMallocAsync)
        is refused with CudaUnavailableError (pool IPC is not implemented). The driver decides which
        (CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE). Raises
        CudaUnavailableError without a driver, a device, cuda-bindings (IPC
        path) or a server accepting the kind. Returns a CudaBuffer (a context
        manager); the tensor must outlive it."""
        cuda_ipc.check_tensor(tensor)  # cuda-bindings, a device, a CUDA tensor
        storage = tensor.untyped_storage() if hasattr(tensor, "untyped_storage") else tensor.storage()
        drv = driver if driver is not None else cuda_vmm.driver()
        if cuda_vmm.plan(drv, storage.data_ptr()) == cuda_vmm.LEGACY_IPC:
            return self._register_ipc(cuda_ipc.export(tensor, self.server_info), name)
        return self._register_vmm(drv, storage.data_ptr(), storage.nbytes(), str(tensor.device),
                                  name)

    def register_cuda_pointer(self, address, size, *, name=None, driver=None):
        """register_cuda for raw device memory [address, address + size) (any
        CUDA allocation of this process), by CUDA IPC or by VMM descriptor as
        the driver says. The memory must outlive the returned CudaBuffer."""
        drv = driver if driver is not None else cuda_vmm.driver()
        address, size = int(address), int(size)
        if cuda_vmm.plan(drv, address) == cuda_vmm.LEGACY_IPC:
            self._require_kind(cuda_vmm.LEGACY_IPC)
            return self._register_ipc(cuda_vmm.export_legacy(drv, address, size), name)
        return self._register_vmm(drv, address, size, None, name)

    def _require_kind(self, kind):
        if kind not in self.server_info.memory_kinds:
            raise errors.CudaUnavailableError("the server (backend %s) does not accept %s buffers"
                                              % (self.server_info.backend, kind))

    def _register_ipc(self, spec, name):
        name = name or "cuda-%x" % spec.address
        buf = cuda_ipc.CudaBuffer(self, name, spec)
        self._register(name, pb.RegisterBufferRequest(name=name, cuda_ipc=pb.CudaIpc(
            handle=spec.handle, device_uuid=spec.device_uuid, offset=spec.offset, size=spec.size)),
            spec.address, spec.size, spec.device, buf)
        return buf

    def _register_vmm(self, drv, address, size, device, name):
        self._require_kind(cuda_vmm.VMM)  # before anything is exported
        spec = cuda_vmm.export(drv, address, size, device)
        try:
            name = name or "cuda-%x" % spec.address
            buf = cuda_ipc.CudaBuffer(self, name, spec, fd=spec.fds)
            passed = pb.PassedFd(offset=spec.offset, size=spec.size,
                                 device_uuid=spec.device_uuid)
            if len(spec.fds) == 1:
                # One allocation: the single form, which every server takes.
                passed.allocation_size = spec.allocation_sizes[0]
            else:
                for extent in spec.allocation_sizes:  # tickets filled in per send
                    passed.segments.add(allocation_size=extent)
            self._register(name, pb.RegisterBufferRequest(name=name, fd=passed),
                           spec.address, spec.size, spec.device, buf, fd=spec.fds)
        except BaseException:
            for fd in spec.fds:
                os.close(fd)
            raise
        return buf

    def _with_ticket(self, request, fd):
        """`request`, with a fresh fd channel ticket for `fd` when it has one:
        a descriptor, or a tuple of them (a CUDA VMM buffer of several
        allocations: one ticket per fd.segments entry, in order)."""
        if fd is None:
            return request
        # A device_uuid marks a CUDA VMM descriptor (host memory has none).
        kind = (pb.FD_KIND_CUDA_VMM if request.HasField("fd") and request.fd.device_uuid
                else pb.FD_KIND_HOST_MEMORY)
        ticketed = pb.RegisterBufferRequest()
        ticketed.CopyFrom(request)
        fds = tuple(fd) if isinstance(fd, (tuple, list)) else (fd,)
        tickets = [fd_channel_module.send_fd(self.fd_channel, self.session_id, one, kind=kind,
                                             timeout=self.timeout).ticket for one in fds]
        if request.fd.segments:
            for segment, ticket in zip(ticketed.fd.segments, tickets):
                segment.ticket = ticket
        else:
            ticketed.fd.ticket = tickets[0]
        return ticketed

    def _register(self, name, request, address, size, device, owner, fd=None):
        self.call("RegisterBuffer", self._with_ticket(request, fd))
        with self._lock:
            self._regions[name] = _Region(address, size, device, owner, request, fd)

    def _unregister(self, buf):
        with self._lock:
            registered = self._regions.pop(buf.name, None) is not None
        if registered and self.session_id is not None:
            self.call("UnregisterBuffer", pb.UnregisterBufferRequest(name=buf.name))

    def registered_buffer(self, x):
        """The name of the registered buffer holding all of array/tensor `x`
        (which ops then pass by reference), or None (it would go inline)."""
        layout = layout_of(as_array(x))
        extent = layout.extent()
        if not extent:
            return None
        found = self._find_region(layout.address, extent, layout.device)
        return found[0] if found else None

    def list_buffers(self):
        """This session's buffers as tokensel.v1.BufferInfo messages."""
        return list(self.call("ListBuffers", pb.ListBuffersRequest()).buffers)

    # ----------------------------------------------------------------- ops --

    def run(self, prepared):
        """Runs one PreparedOp (from `client.ops`) with its own RPC."""
        return prepared.finish(self.call(prepared.rpc, prepared.request))

    def stream(self, *, window=16, timeout=None):
        """Opens a tokensel.Stream on this session: PreparedOps pipelined on
        one Stream RPC (`submit` returns a future; `map` runs many). Use it as
        a context manager; see tokensel.stream."""
        return Stream(self, window=window, timeout=timeout)

    def execute(self, prepared_ops, *, wait_event=None, record_event=None):
        """Runs PreparedOps (from `client.ops`) in order in one round trip;
        returns their results. The first failing op raises (its message
        starts with "ops[i] (Name): ") and the later ones do not run.

        wait_event / record_event: CUDA IPC events (ExecuteRequest fields),
        each a torch.cuda.Event(interprocess=True) or the 64 bytes of a
        cudaIpcEventHandle_t; checked here (ValueError / TypeError, before
        any RPC) and sent as given. A CPU server answers
        FailedPreconditionError naming the field. On a CUDA server all the
        ops run in order on one stream that first waits on wait_event, and
        record_event is recorded after the last op. The contract
        (docs/server.md, "CUDA IPC events"):
          - record wait_event on your stream after the work that writes the
            inputs, before this call;
          - with record_event and no inline output the call returns before
            the device work is done: make your stream wait on record_event
            (torch.cuda.current_stream().wait_event(ev)) before reading the
            outputs or reusing the inputs;
          - an error the device finds after such a return is raised by the
            session's next execute() (which then runs nothing), its message
            starting "deferred from async Execute #N of this session:
            ops[k] (Name): "; execute([]) waits for the session's pending
            work and raises that error if there is one;
          - at most 16 such calls per session in flight
            (ResourceExhaustedError beyond);
          - an event passed must stay alive (not destroyed nor reused for
            another purpose) while the server may use it: this client keeps
            a reference to each until the session's next barrier
            (execute([]) without events; it keeps those of calls that ended
            after it began) or close(), which runs such a barrier first."""
        prepared_ops = list(prepared_ops)
        request = pb.ExecuteRequest(
            ops=[pb.Op(**{p.field: p.request}) for p in prepared_ops],
            wait_event=cuda_ipc.event_handle(wait_event, "wait_event"),
            record_event=cuda_ipc.event_handle(record_event, "record_event"))
        barrier = not prepared_ops and wait_event is None and record_event is None
        # A barrier completes every Execute answered before it began: the
        # events held for those (appended once their call ended) may go.
        answered = len(self._held_events)
        try:
            response = self.call("Execute", request)
        except errors.TokenselError as err:
            if barrier and "deferred from async Execute" in str(err):
                del self._held_events[:answered]  # that work completed too
            raise
        else:
            if barrier:
                del self._held_events[:answered]
        finally:
            # Held once the call ended, answered or not (the caller holds
            # them during it): the server's streams may still wait on or
            # record them, after an error too.
            for event in (wait_event, record_event):
                if event is not None and not isinstance(event, (bytes, bytearray, memoryview)):
                    self._held_events.append(event)
        return [p.finish(r) for p, r in zip(prepared_ops, response.results)]


def _op_method(name):
    build = getattr(OpBuilder, name)

    @functools.wraps(build)
    def method(self, *args, **kwargs):
        return self.run(getattr(self.ops, name)(*args, **kwargs))
    return method


for _name in OP_NAMES:
    setattr(Client, _name, _op_method(_name))
