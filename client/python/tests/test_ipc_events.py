"""Execute's CUDA IPC events (wait_event / record_event), on the client side:
what the client accepts and what it sends. No GPU: the server under test is
the CPU one, which answers FAILED_PRECONDITION naming the field, and torch
events are stand-ins with an ipc_handle() method (torch.cuda.Event's API)."""
import numpy as np
import pytest

import tokensel


class FakeIpcEvent:
    """torch.cuda.Event(interprocess=True) as far as the client can tell."""

    def __init__(self, handle):
        self.handle = handle
        self.calls = 0

    def ipc_handle(self):
        self.calls += 1
        return self.handle


class NotInterprocessEvent:
    """torch.cuda.Event() without interprocess=True: ipc_handle() raises."""

    def ipc_handle(self):
        raise RuntimeError("Event must be created with interprocess=True")


@pytest.fixture
def sent(client, monkeypatch):
    """The ExecuteRequests the client sends (then sent for real)."""
    requests = []
    real = client.call

    def capture(rpc, request, *args, **kwargs):
        if rpc == "Execute":
            requests.append(request)
        return real(rpc, request, *args, **kwargs)

    monkeypatch.setattr(client, "call", capture)
    return requests


def gather(client):
    act = np.arange(2 * 5 * 3, dtype=np.float32).reshape(2, 5, 3)
    return client.ops.gather_tokens(act, np.array([[4, 0], [1, 3]], dtype=np.int32))


def test_without_events_nothing_is_sent_and_the_op_runs(client, sent):
    (out,) = client.execute([gather(client)])
    act = np.arange(2 * 5 * 3, dtype=np.float32).reshape(2, 5, 3)
    np.testing.assert_array_equal(np.asarray(out), act[[[0], [1]], [[4, 0], [1, 3]]])
    assert sent[0].wait_event == b"" and sent[0].record_event == b""


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_raw_handle_bytes_are_sent_as_given(client, sent, kind):
    handle = bytes(range(64))
    with pytest.raises(tokensel.FailedPreconditionError, match="wait_event: CUDA IPC events"):
        client.execute([gather(client)], wait_event=kind(handle))
    assert sent[0].wait_event == handle
    assert sent[0].record_event == b""


def test_a_torch_style_event_sends_its_ipc_handle(client, sent):
    event = FakeIpcEvent(b"\xab" * 63 + b"\x01")
    with pytest.raises(tokensel.FailedPreconditionError, match="record_event") as info:
        client.execute([gather(client)], record_event=event)
    assert event.calls == 1
    assert sent[0].record_event == b"\xab" * 63 + b"\x01"
    assert sent[0].wait_event == b""
    assert "cuda backend" in info.value.message


def test_both_events_are_sent(client, sent):
    with pytest.raises(tokensel.FailedPreconditionError):
        client.execute([gather(client)], wait_event=b"\x01" * 64,
                       record_event=FakeIpcEvent(b"\x02" * 64))
    assert sent[0].wait_event == b"\x01" * 64
    assert sent[0].record_event == b"\x02" * 64


@pytest.mark.parametrize("length", [0, 1, 63, 65, 128])
def test_a_handle_of_another_length_is_refused_before_any_rpc(client, sent, length):
    if length == 0:
        # b"" is "no event" only as None; an empty handle is a mistake.
        event = bytearray()
    else:
        event = b"\x00" * length
    with pytest.raises(ValueError, match="record_event: a CUDA IPC event handle is 64 bytes, got %d"
                       % length):
        client.execute([gather(client)], record_event=event)
    assert sent == []


def test_an_event_without_ipc_is_refused_before_any_rpc(client, sent):
    with pytest.raises(ValueError, match="wait_event: the event has no IPC handle"):
        client.execute([gather(client)], wait_event=NotInterprocessEvent())
    assert sent == []


@pytest.mark.parametrize("event", [64, "x" * 64, [0] * 64])
def test_other_types_are_refused_before_any_rpc(client, sent, event):
    with pytest.raises(TypeError, match="wait_event takes a torch.cuda.Event"):
        client.execute([gather(client)], wait_event=event)
    assert sent == []


def test_a_passed_event_is_kept_alive_until_the_next_barrier(client, sent):
    import gc
    import weakref
    event = FakeIpcEvent(b"\xab" * 63 + b"\x01")
    ref = weakref.ref(event)
    with pytest.raises(tokensel.FailedPreconditionError):
        client.execute([gather(client)], record_event=event)
    del event
    gc.collect()
    assert ref() is not None, "the server may still use it"
    client.execute([])  # the barrier: the session's work completed
    gc.collect()
    assert ref() is None


def test_a_barrier_keeps_the_events_of_calls_that_ended_after_it_began(client, monkeypatch):
    """Another thread's evented call that ends while a barrier is on its way
    (its Execute may reach the server after the barrier) keeps its event."""
    import gc
    import weakref
    late = FakeIpcEvent(b"\xcd" * 63 + b"\x02")
    ref = weakref.ref(late)
    real = client.call

    def barrier_meanwhile_another_call_ends(rpc, request, *args, **kwargs):
        if rpc == "Execute" and not request.ops:
            with pytest.raises(tokensel.FailedPreconditionError):
                client.execute([gather(client)], record_event=late)
        return real(rpc, request, *args, **kwargs)

    monkeypatch.setattr(client, "call", barrier_meanwhile_another_call_ends)
    client.execute([])
    monkeypatch.setattr(client, "call", real)
    del late
    gc.collect()
    assert ref() is not None, "its call ended after the barrier began"
    client.execute([])
    gc.collect()
    assert ref() is None


def test_close_waits_for_the_sessions_work_before_dropping_its_events(client, sent):
    event = FakeIpcEvent(b"\xef" * 63 + b"\x03")
    with pytest.raises(tokensel.FailedPreconditionError):
        client.execute([gather(client)], record_event=event)
    sent.clear()
    client.close()
    assert len(sent) == 1 and not sent[0].ops and sent[0].record_event == b"", \
        "close() runs a barrier first"
