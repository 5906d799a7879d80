"""What reading the run-queue clock costs (``runtime/hooks/request/runqueue.py``): EngineCore
reads its thread's twice per step while a request waits for its first token, a CPU worker its
thread's and its ZeroMQ I/O threads' once per step (three more times in a step that runs a
prefill). One thread, and three (this thread's file opened three times: the same reads)."""

from __future__ import annotations

import argparse
import os
import statistics
import timeit

from otel_ttft.runtime.hooks.request.runqueue import RunQueueClock


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reads", type=int, default=20000)
    args = parser.parse_args()
    one = RunQueueClock()
    three = RunQueueClock()
    if one.seconds() is None or three.seconds() is None:
        raise SystemExit("no /proc/thread-self/schedstat here: nothing to measure")
    three._fds += [os.open("/proc/thread-self/schedstat", os.O_RDONLY | os.O_CLOEXEC)
                   for _ in range(2)]
    for name, clock in (("one thread", one), ("three threads", three)):
        per = [timeit.timeit(clock.seconds, number=args.reads) / args.reads * 1e6
               for _ in range(args.rounds)]
        print(f"{name}: median {statistics.median(per):.2f} us per read "
              f"(rounds {min(per):.2f}-{max(per):.2f})")


if __name__ == "__main__":
    main()
