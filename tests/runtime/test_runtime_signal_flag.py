"""A SIGTERM never deadlocks the process that polls for it (``durapipe.runtime.signalflag``).

An upload agent left by a test here outlived its SIGTERM by 13 minutes: gdb showed its one
thread inside the SIGTERM handler, blocked acquiring a lock, which is what ``Event.set`` does
when the handler lands while its own thread holds the event's lock inside ``Event.wait``.  The
window is a few bytecodes, so no test makes it happen on demand (3,000 signals to a tight
``Event.wait`` loop did not); these guard the property for the flag that replaced the event in
the agent, the SDK and the wrapper: each poller ends within seconds of its SIGTERM, every time,
and the flag wakes every waiter."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from durapipe.runtime.signalflag import SignalFlag
from tests.runtime.runtime_helpers import child_env

POLLER = """
import signal, sys
from durapipe.runtime.signalflag import SignalFlag
flag = SignalFlag()
signal.signal(signal.SIGTERM, lambda *_: flag.set())
print("ready", flush=True)
while not flag.is_set():
    flag.wait(0.0001)  # as tight as a poll gets: the handler lands inside wait() often
sys.exit(143)
"""

SDK_WAITER = """
import sys
from durapipe.runtime import sdk
sdk.install_stop_handler()
print("ready", flush=True)
while not sdk.wait_for_stop(timeout=0.0001):
    pass
sys.exit(143)
"""


@pytest.mark.parametrize("program", [POLLER, SDK_WAITER], ids=["flag", "sdk-wait-for-stop"])
def test_a_sigterm_landing_inside_a_wait_ends_the_process(program: str) -> None:
    for _ in range(30):
        proc = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE,
                                text=True, env=child_env())
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(timeout=10) == 143
        finally:
            if proc.poll() is None:
                proc.kill()


def test_the_flag_wakes_every_waiter_and_stays_set() -> None:
    import threading

    flag = SignalFlag()
    assert not flag.wait(0.01) and not flag.is_set()
    woken: list[bool] = []
    waiters = [threading.Thread(target=lambda: woken.append(flag.wait(30))) for _ in range(3)]
    for waiter in waiters:
        waiter.start()
    flag.set()
    for waiter in waiters:
        waiter.join(10)
    assert woken == [True, True, True]
    began = time.monotonic()
    assert flag.wait(30) and time.monotonic() - began < 1
