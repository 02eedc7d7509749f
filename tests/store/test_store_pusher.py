"""The background pusher: one push in flight at a time, in order; a failure is kept until it is collected and
never lost; without background pushing, the push is complete on return."""

from __future__ import annotations

import threading

import pytest

from baton.checkpoint.pusher import Pusher, PushFailed


def test_one_push_in_flight_and_in_order():
    release = [threading.Event(), threading.Event()]
    order, running = [], []

    def push(i):
        def run():
            running.append(i)
            assert len(running) == 1, "two pushes overlapped"
            release[i].wait(10)
            order.append(i)
            running.remove(i)
            return i
        return run

    p = Pusher(background=True)
    p.start(1, push(0))
    assert p.in_flight and p.failure() is None
    t = threading.Thread(target=p.start, args=(2, push(1)))  # the next save waits for the previous push
    t.start()
    t.join(0.2)
    assert t.is_alive() and order == []
    release[0].set()
    t.join(10)
    release[1].set()
    assert p.wait() == 1 and order == [0, 1]


def test_failure_is_reported_once_with_its_step():
    gate = threading.Event()

    def failing():
        gate.wait(10)
        raise OSError("connection reset by peer")

    p = Pusher(background=True)
    p.start(8, failing)
    assert p.failure() is None  # still running: nothing to report yet
    gate.set()
    p._thread.join(10)
    f = p.failure()
    assert isinstance(f, PushFailed) and f.step == 8 and "connection reset by peer" in str(f)
    with pytest.raises(PushFailed, match="OSError: connection reset by peer"):
        p.wait()
    assert p.failure() is None and p.wait() is None  # collected: the caller owns it now


def test_a_later_push_waits_and_surfaces_the_earlier_failure():
    p = Pusher(background=True)
    p.start(4, lambda: (_ for _ in ()).throw(RuntimeError("store down")))
    with pytest.raises(PushFailed) as e:
        p.start(8, lambda: 8)
    assert e.value.step == 4


def test_foreground_push_is_complete_on_return():
    p = Pusher(background=False)
    seen = []
    p.start(3, lambda: seen.append(threading.current_thread().name) or 3)
    assert seen == [threading.current_thread().name] and not p.in_flight and p.wait() == 3
