"""tokensel.Stream: many requests pipelined on one bidirectional Stream RPC.

    with client.stream() as stream:
        futures = [stream.submit(client.ops.gather_tokens(acts, ids[l])) for l in range(L)]
        parts = [f.result() for f in futures]
        # or: parts = stream.map(client.ops.gather_tokens(acts, i) for i in ids)

A unary call waits a round trip per op; a stream keeps up to `window`
requests in flight, so small ops cost the server's time, not the latency of
the channel. The server answers in order; a request that fails fails only its
own future (with the TokenselError subclass of its code) and the stream goes
on. A broken stream (server gone, deadline, close) fails every pending and
later future with the error that broke it.

Results are what the matching Client methods return. Outputs written "in
place" (registered buffers, `out=` arrays) are written when the future
completes, not when `submit` returns: do not reuse an input or read an output
before its future is done. The stream carries the client's session: its
buffers are usable by reference, and the session does not expire while the
stream is open.
"""
import collections
import concurrent.futures
import queue
import threading

import grpc

from tokensel import errors
from tokensel.v1 import tokensel_pb2 as pb

_END = object()

# (request_id, future, finish(StreamResponse) -> result)
_Pending = collections.namedtuple("_Pending", "request_id future finish")


class Stream:
    """One Stream RPC of `client` (see the module docstring). `window`: the
    most requests awaiting an answer; `submit` blocks while that many are
    pending (the server itself reads at most 8 ahead). `timeout`: deadline of
    the whole stream in seconds (None = none). Thread-safe."""

    def __init__(self, client, *, window=16, timeout=None):
        if int(window) < 1:
            raise ValueError("window must be >= 1, got %r" % (window,))
        if client.session_id is None:
            raise errors.FailedPreconditionError("the client is closed")
        self._client = client
        self._slots = threading.BoundedSemaphore(int(window))
        self._lock = threading.Lock()
        self._pending = collections.deque()
        self._next_id = 1
        self._error = None  # the error that broke (or closed) the stream
        self._requests = queue.Queue()
        self._call = client._open_stream(iter(self._requests.get, _END), timeout)
        self._reader = threading.Thread(target=self._read, name="tokensel-stream", daemon=True)
        self._reader.start()

    # ------------------------------------------------------------- submits --

    def submit(self, prepared):
        """Sends one PreparedOp (from `client.ops`); returns a
        concurrent.futures.Future of its result."""
        request = pb.StreamRequest(op=pb.Op(**{prepared.field: prepared.request}))
        return self._send(request, lambda r: prepared.finish(_payload(r, "op")))

    def submit_execute(self, prepared_ops):
        """Sends PreparedOps as one Execute (run in order, the first failure
        stops the rest); the future's result is the list of their results."""
        prepared_ops = list(prepared_ops)
        request = pb.StreamRequest(execute=pb.ExecuteRequest(
            ops=[pb.Op(**{p.field: p.request}) for p in prepared_ops]))

        def finish(response):
            results = _payload(response, "execute").results
            return [p.finish(r) for p, r in zip(prepared_ops, results)]
        return self._send(request, finish)

    def run(self, prepared):
        """submit(prepared).result()."""
        return self.submit(prepared).result()

    def map(self, prepared_ops):
        """Pipelines every PreparedOp of the iterable; returns their results
        in order, raising the first failure (after all of them finished)."""
        futures = [self.submit(p) for p in prepared_ops]
        concurrent.futures.wait(futures)
        return [f.result() for f in futures]

    def _send(self, request, finish):
        self._slots.acquire()
        future = concurrent.futures.Future()
        future.set_running_or_notify_cancel()  # sent requests cannot be taken back
        with self._lock:
            if self._error is not None:
                self._slots.release()
                future.set_exception(self._error)
                return future
            request.request_id = self._next_id
            self._next_id += 1
            self._pending.append(_Pending(request.request_id, future, finish))
            self._requests.put(request)
        return future

    # ------------------------------------------------------------- answers --

    def _read(self):
        broke = None
        try:
            for response in self._call:
                with self._lock:
                    entry = self._pending.popleft() if self._pending else None
                if entry is None or entry.request_id != response.request_id:
                    broke = errors.InternalError(
                        "stream: answer for request %d, expected %s" %
                        (response.request_id, entry.request_id if entry else "none"))
                    if entry is not None:
                        entry.future.set_exception(broke)
                        self._slots.release()
                    break
                self._complete(entry, response)
        except grpc.RpcError as err:
            broke = self._client._explain(err)
        except BaseException as err:  # noqa: BLE001 - handed to every pending future
            broke = errors.InternalError("stream reader failed: %r" % (err,))
        self._fail_pending(broke or errors.UnavailableError(
            "the stream ended with requests unanswered"))

    def _complete(self, entry, response):
        try:
            if response.code != 0:
                raise errors.from_code(_status_code(response.code), response.message)
            entry.future.set_result(entry.finish(response))
        except BaseException as err:  # noqa: BLE001 - the future carries it
            entry.future.set_exception(err)
        finally:
            self._slots.release()

    def _fail_pending(self, error):
        with self._lock:
            if self._error is None:
                self._error = error
            pending, self._pending = list(self._pending), collections.deque()
            self._requests.put(_END)
        for entry in pending:
            entry.future.set_exception(error)
            self._slots.release()

    # --------------------------------------------------------------- close --

    def close(self):
        """Half-closes the stream, waits for every pending answer, and ends
        it. Idempotent; later submits fail with FailedPreconditionError."""
        with self._lock:
            closed = self._error is not None
            if not closed:
                self._error = errors.FailedPreconditionError("the stream is closed")
                self._requests.put(_END)
        self._reader.join()

    def cancel(self):
        """Ends the stream now: pending futures fail with CANCELLED."""
        self._call.cancel()
        self._reader.join()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _payload(response, field):
    if response.WhichOneof("response") != field:
        raise errors.InternalError("stream: expected a %s answer, got %s" %
                                   (field, response.WhichOneof("response")))
    return getattr(response, field)


def _status_code(value):
    """The grpc.StatusCode whose numeric value (google.rpc.Code) is `value`."""
    return _CODES.get(value, grpc.StatusCode.UNKNOWN)


_CODES = {code.value[0]: code for code in grpc.StatusCode}
