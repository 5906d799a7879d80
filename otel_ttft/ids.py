"""Trace and span ids that stay unique when vLLM seeds Python's ``random``.

vLLM seeds the global ``random`` (seed 0 unless ``--seed`` says otherwise) in every engine
process, and the SDK's default ``RandomIdGenerator`` draws ids from that global generator: every
process and every engine after the seed would produce the same trace and span ids, and a backend
would merge or drop the spans that collide. While instrumented, the default generator draws from a
private generator seeded from the OS instead (re-seeded in a forked child), for every tracer of
every provider in the process, those made before instrumenting included. As cheap as before.
"""

from __future__ import annotations

import os
import random

from opentelemetry import trace
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

_private = random.Random(os.urandom(32))
_originals: tuple | None = None


def _reseed() -> None:
    _private.seed(os.urandom(32))


os.register_at_fork(after_in_child=_reseed)


def _span_id(self: RandomIdGenerator) -> int:
    span_id = _private.getrandbits(64)
    while span_id == trace.INVALID_SPAN_ID:
        span_id = _private.getrandbits(64)
    return span_id


def _trace_id(self: RandomIdGenerator) -> int:
    trace_id = _private.getrandbits(128)
    while trace_id == trace.INVALID_TRACE_ID:
        trace_id = _private.getrandbits(128)
    return trace_id


def install() -> None:
    global _originals
    if _originals is None:
        _originals = (RandomIdGenerator.generate_span_id, RandomIdGenerator.generate_trace_id)
        RandomIdGenerator.generate_span_id = _span_id
        RandomIdGenerator.generate_trace_id = _trace_id


def uninstall() -> None:
    global _originals
    if _originals is not None:
        RandomIdGenerator.generate_span_id, RandomIdGenerator.generate_trace_id = _originals
        _originals = None


def new_span_id() -> int:
    """A span id from the private generator (child spans we build as finished ``ReadableSpan``)."""
    return _private.getrandbits(64) or 1


def chance(ratio: float) -> bool:
    """True with probability ``ratio``, from the private generator (vLLM seeds ``random``)."""
    return _private.random() < ratio
