"""SIGTERM as an interruption: what schedulers, ``docker stop``, ``timeout`` and torchrun (to the other ranks when one
fails) send. The CLI turns it into ``Terminated``, which a run handles like Ctrl-C (``meta.json`` says
``interrupted``, finished stages keep their artifacts), and exits 143 (128 + 15) as the signal's convention wants."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

EXIT_CODE = 128 + signal.SIGTERM


class Terminated(BaseException):  # noqa: N818 - like KeyboardInterrupt: not an Exception, so nothing swallows it
    """Raised in the main thread by SIGTERM while ``terminating_raises`` is active."""


def _raise(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM during the clean-up ends the process at once
    raise Terminated


@contextlib.contextmanager
def terminating_raises() -> Iterator[None]:
    """While active, SIGTERM raises ``Terminated``; the previous handler is restored after. Outside the main thread
    (where Python delivers signals) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
