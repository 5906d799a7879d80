"""Run a command while the wall clock steps, as it does when a VM is restored from a snapshot.

Usage (root: it sets CLOCK_REALTIME): ``python scripts/wall_clock_steps.py STEP_S EVERY_S --
COMMAND...``, e.g. ``python scripts/wall_clock_steps.py 4 20 -- .venv/bin/python -m pytest -q
tests``. Every ``EVERY_S`` seconds the wall clock jumps ``STEP_S`` ahead while the monotonic one
runs on; when the command ends the clock is stepped back by the total. Spans that mix the two
clocks come apart under it (CI's failures of 2026-12-02 were reproduced this way).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time


def main(argv: list[str]) -> int:
    if "--" not in argv or len(argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        step, every = float(argv[0]), float(argv[1])
    except ValueError:
        print("STEP_S and EVERY_S are seconds", file=sys.stderr)
        return 2
    command = argv[argv.index("--") + 1:]
    stepped = [0.0]
    done = threading.Event()

    def steps() -> None:
        while not done.wait(every):
            time.clock_settime(time.CLOCK_REALTIME, time.time() + step)
            stepped[0] += step
            print(f"[wall clock] stepped {step:+} s (total {stepped[0]:+})", file=sys.stderr)

    try:
        time.clock_settime(time.CLOCK_REALTIME, time.time())  # not allowed: say so before running
    except PermissionError:
        print("setting the wall clock needs root (CAP_SYS_TIME)", file=sys.stderr)
        return 2
    stepper = threading.Thread(target=steps, daemon=True)
    stepper.start()
    try:
        return subprocess.call(command)
    finally:
        done.set()
        stepper.join()
        time.clock_settime(time.CLOCK_REALTIME, time.time() - stepped[0])
        print(f"[wall clock] stepped back {-stepped[0]:+} s", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
