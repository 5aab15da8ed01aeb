"""Many files at once: the commit and the restore of a checkpoint share one worker pool shape."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")
_DONE = object()


def run_parallel(action: Callable[[T], None], items: Iterable[T], workers: int) -> None:
    """Apply ``action`` to every item on up to ``workers`` threads; re-raise the first error.

    Plain threads rather than ``concurrent.futures``: its executors refuse work once the
    interpreter starts shutting down, which is exactly when the exit hook flushes uploads.
    """
    pending = iter(list(items))
    errors: list[BaseException] = []
    lock = threading.Lock()

    def drain() -> None:
        while True:
            with lock:
                if errors:
                    return
                item = next(pending, _DONE)
            if item is _DONE:
                return
            try:
                action(item)  # type: ignore[arg-type]
            except BaseException as error:  # noqa: BLE001 (re-raised by the caller's thread)
                with lock:
                    errors.append(error)
                return

    if workers <= 1:
        drain()
    else:
        threads = [threading.Thread(target=drain, daemon=True) for _ in range(workers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    if errors:
        raise errors[0]
