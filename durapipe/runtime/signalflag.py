"""A flag a signal handler may set.

``threading.Event.set`` takes the event's lock, and Python runs a signal handler in the main
thread between two bytecodes: a SIGTERM that lands while the main thread is inside
``Event.wait`` (which holds the same lock on its way in and out) deadlocks the handler on it,
and the process never stops (seen: an upload agent that polled ``stopping.wait(0.02)`` outlived
its SIGTERM by 13 minutes).  :class:`SignalFlag` is set with a plain assignment and one byte
written to a pipe that every waiter ``select``\\ s on, so setting it takes no lock."""

from __future__ import annotations

import os
import select


class SignalFlag:
    """``is_set``/``set``/``wait`` as :class:`threading.Event` has them, minus ``clear``."""

    def __init__(self) -> None:
        self._set = False
        self._read, self._write = os.pipe()  # not inherited by children (PEP 446)
        os.set_blocking(self._write, False)

    def set(self) -> None:
        if self._set:
            return
        self._set = True
        try:
            os.write(self._write, b"\0")  # never drained: every later wait returns at once
        except OSError:
            pass

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float | None = None) -> bool:
        if not self._set:
            # poll, not select: no FD_SETSIZE limit; one poll object per call, since one
            # object polled from two threads at once is refused.
            poller = select.poll()
            poller.register(self._read, select.POLLIN)
            poller.poll(None if timeout is None else max(0.0, timeout) * 1000)
        return self._set

    def __del__(self) -> None:
        for fd in (getattr(self, "_read", None), getattr(self, "_write", None)):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
