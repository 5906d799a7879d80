"""Trace and span ids that stay unique when vLLM seeds Python's ``random``.

vLLM seeds the global ``random`` (seed 0 unless ``--seed`` says otherwise) in every engine
process, and the SDK's default ``RandomIdGenerator`` draws ids from that global generator: every
process and every engine after the seed would produce the same trace and span ids, and a backend
would merge or drop the spans that collide. While instrumented, the default generator draws from a
private generator seeded from the OS instead (re-seeded in a forked child), for every tracer of
every provider in the process, those made before instrumenting included
(``sdk_internals.patch_default_ids`` says why it is patched). As cheap as before.
"""

from __future__ import annotations

import os
import random
from typing import Any

from opentelemetry import trace

from otel_ttft.runtime.telemetry import sdk_internals

_private = random.Random(os.urandom(32))


def _reseed() -> None:
    _private.seed(os.urandom(32))


os.register_at_fork(after_in_child=_reseed)


def _span_id(self: Any) -> int:
    span_id = _private.getrandbits(64)
    while span_id == trace.INVALID_SPAN_ID:
        span_id = _private.getrandbits(64)
    return span_id


def _trace_id(self: Any) -> int:
    trace_id = _private.getrandbits(128)
    while trace_id == trace.INVALID_TRACE_ID:
        trace_id = _private.getrandbits(128)
    return trace_id


def install() -> None:
    sdk_internals.patch_default_ids(_span_id, _trace_id)


def uninstall() -> None:
    sdk_internals.restore_default_ids()


def new_span_id() -> int:
    """A span id from the private generator (child spans we build as finished ``ReadableSpan``)."""
    return _private.getrandbits(64) or 1


def chance(ratio: float) -> bool:
    """True with probability ``ratio``, from the private generator (vLLM seeds ``random``)."""
    return _private.random() < ratio
