"""The servers the CLI runs in the foreground (``sink``, ``prometheus``) run until this returns."""

from __future__ import annotations

import signal
import threading


def wait_for_stop(stop: threading.Event | None = None) -> None:
    """Block until ``stop`` is set, SIGTERM arrives or Ctrl-C is pressed (the signal handler is
    installed only on the main thread, where Python allows one)."""
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass
