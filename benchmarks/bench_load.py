"""The end-to-end benchmark's load: fixed prompts, streamed completions over a raw socket, closed
or open loops, and the CPU placement argument."""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import time
from concurrent.futures import ThreadPoolExecutor

from otel_ttft.tools.replay.server import VllmServer


def workload(n: int, seed: int = 0) -> list[list[int]]:
    """Fixed prompts (token ids): short, medium and long, none sharing a prefix."""
    rng = random.Random(seed)
    return [[rng.randrange(10, 2000) for _ in range((16, 64, 256)[i % 3])] for i in range(n)]


def one(port: int, model: str, prompt: list[int], max_tokens: int,
        traced: bool) -> tuple[float, int]:
    """Client TTFT (s) and output tokens of one streamed completion, over a raw socket: the
    first ``data:`` counts when its bytes arrive, with no client-side buffering in between.
    ``traced``: a sampled ``traceparent`` of its own, as a traced gateway would send."""
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0, "ignore_eos": True, "stream": True}).encode()
    parent = (f"traceparent: 00-{random.getrandbits(128):032x}-{random.getrandbits(64):016x}"
              "-01\r\n" if traced else "")
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n{parent}"
            "Connection: close\r\n\r\n").encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=300)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    t0 = time.monotonic()
    ttft, data = None, bytearray()
    try:
        sock.sendall(head + body)
        while chunk := sock.recv(65536):
            data += chunk
            if ttft is None and b"data: {" in data:
                ttft = time.monotonic() - t0
    finally:
        sock.close()
    assert data.startswith(b"HTTP/1.1 200"), bytes(data[:300])
    return ttft or float("nan"), data.count(b"data: {")


def parse_load(load: str) -> tuple[int, float | None]:
    """``c4``: closed loop, 4 at a time; ``r12``: open loop, 12 requests/s; ``i10``: no request
    for 10 s (what the server does per second on its own)."""
    if load.startswith(("c", "i")):
        return int(load[1:]), None
    if load.startswith("r"):
        return 0, float(load[1:])
    raise argparse.ArgumentTypeError(f"load {load!r}: c<concurrency> or r<requests/s>")


def run(server: VllmServer, model: str, prompts: list[list[int]], max_tokens: int, load: str,
        traced: bool) -> dict:
    """All prompts, streamed: ``concurrency`` at a time (closed loop), or one started every
    ``1/rate`` s whatever the server does (open loop: every arm then takes the same wall time,
    so per-second work in the server weighs the same on all)."""
    concurrency, rate = parse_load(load)
    t0 = time.monotonic()
    if load.startswith("i"):
        time.sleep(concurrency)
        return {"wall_s": time.monotonic() - t0, "tokens": 0, "ttft_s": [], "requests": 0}
    if rate is None:
        with ThreadPoolExecutor(concurrency) as pool:
            results = list(pool.map(lambda p: one(server.port, model, p, max_tokens, traced),
                                    prompts))
    else:
        def paced(item: tuple[int, list[int]]) -> tuple[float, int]:
            delay = t0 + item[0] / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            return one(server.port, model, item[1], max_tokens, traced)

        with ThreadPoolExecutor(int(rate * 4) + 4) as pool:
            results = list(pool.map(paced, enumerate(prompts)))
    wall = time.monotonic() - t0
    return {"wall_s": wall, "tokens": sum(c for _, c in results),
            "ttft_s": [t for t, _ in results], "requests": len(results)}


def parse_pin(text: str) -> tuple[set[int], set[int]] | None:
    """``API:REST`` CPU lists (``0:1``, ``0:1-3``), or None for no pinning."""
    if not text:
        return None

    def cpus(part: str) -> set[int]:
        out: set[int] = set()
        for item in part.split(","):
            lo, _, hi = item.partition("-")
            out.update(range(int(lo), int(hi or lo) + 1))
        return out

    api, sep, rest = text.partition(":")
    if not sep:
        raise SystemExit(f"--pin {text!r}: API:REST, e.g. 0:1")
    placement = cpus(api), cpus(rest)
    if placement[0] & placement[1] or not placement[0] | placement[1] <= os.sched_getaffinity(0):
        raise SystemExit(f"--pin {text!r}: two disjoint CPU lists among "
                         f"{sorted(os.sched_getaffinity(0))}")
    return placement
