"""Read the traces `analyze` needs from a Tempo: TraceQL search, then each trace by id.

Tempo answers ``GET /api/search?q=<TraceQL>&start&end&limit`` with ``{"traces": [...]}``
and ``GET /api/traces/<id>`` with OTLP JSON under ``batches`` (``resourceSpans`` in newer
versions, wrapped in ``{"trace": ...}`` by ``/api/v2/traces``); ids there are base64 or hex.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx

from otel_ttft import semconv
from otel_ttft.tools.sink import otlp_decode

# Every trace analysis can use: replay runs and requests, server requests, activations, evictions.
TRACEQL = "{ " + " || ".join(f'name = "{name}"' for name in (
    semconv.SPAN_REPLAY_RUN, semconv.SPAN_REPLAY_REQUEST, semconv.SPAN_REQUEST,
    semconv.SPAN_ACTIVATION, semconv.SPAN_SWITCH)) + " }"
DEFAULT_SINCE_S = 24 * 3600
DEFAULT_LIMIT = 5000
TIMEOUT_S = 30.0  # per answer, start to last byte: a Tempo that trickles is a slow Tempo
MAX_RESPONSE_BYTES = 256 << 20  # one search or trace answer
_ID_FIELDS = ("traceId", "spanId", "parentSpanId")


class TempoError(RuntimeError):
    """Tempo unreachable or answering with something that is not a trace search or a trace."""


def iter_tempo_traces(base_url: str, *, since_s: float | None = None, limit: int | None = None,
                      client: httpx.Client | None = None, timeout_s: float | None = None
                      ) -> Iterator[list[dict]]:
    """Normalized spans of each trace the TraceQL search finds in the last ``since_s`` seconds;
    each answer must arrive whole within ``timeout_s`` (TIMEOUT_S)."""
    base = base_url.rstrip("/")
    end = int(time.time())
    params = {"q": TRACEQL, "start": end - int(since_s or DEFAULT_SINCE_S), "end": end,
              "limit": int(limit or DEFAULT_LIMIT), "spss": 100}
    timeout_s = timeout_s or TIMEOUT_S
    own = client is None
    client = client or httpx.Client(timeout=timeout_s)
    get = lambda url, p: _get_json(client, url, p, timeout_s)  # noqa: E731
    try:
        found = get(f"{base}/api/search", params)
        if not isinstance(found, dict) or not isinstance(found.get("traces", []), list):
            raise TempoError(f"{base}/api/search: not a Tempo search response")
        for entry in found.get("traces") or []:
            trace_id = entry.get("traceID") if isinstance(entry, dict) else None
            if not isinstance(trace_id, str) or not trace_id:
                continue
            spans = decode_trace(get(f"{base}/api/traces/{trace_id}", None),
                                 where=f"{base}/api/traces/{trace_id}")
            if spans:
                yield spans
    finally:
        if own:
            client.close()


def _get_json(client: httpx.Client, url: str, params: dict | None, timeout_s: float) -> Any:
    """The JSON answer of one GET, read whole within ``timeout_s`` and at most
    MAX_RESPONSE_BYTES; TempoError with one line otherwise."""
    deadline = time.monotonic() + timeout_s
    try:
        with client.stream("GET", url, params=params,
                           headers={"Accept": "application/json"}) as response:
            body = bytearray()
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) > MAX_RESPONSE_BYTES:
                    raise TempoError(f"{url}: the answer is over the "
                                     f"{MAX_RESPONSE_BYTES >> 20} MiB cap")
                if time.monotonic() > deadline:
                    raise TempoError(f"{url}: no complete answer within {timeout_s:g} s")
    except httpx.HTTPError as exc:
        raise TempoError(f"{url}: {type(exc).__name__}: {exc}".splitlines()[0]) from None
    if response.status_code != 200:
        text = bytes(body[:200]).decode("utf-8", "replace")
        raise TempoError(f"{url}: HTTP {response.status_code} {text!r}")
    try:
        return json.loads(body)
    except RecursionError:
        raise TempoError(f"{url}: the answer is JSON nested too deeply") from None
    except ValueError:
        raise TempoError(f"{url}: the answer is not JSON") from None


def decode_trace(body: Any, *, where: str = "tempo") -> list[dict]:
    """Spans from one trace-by-id answer (v1 ``batches``, OTLP ``resourceSpans``, v2 ``trace``)."""
    if isinstance(body, dict) and isinstance(body.get("trace"), dict):
        body = body["trace"]
    if not isinstance(body, dict):
        raise TempoError(f"{where}: not a trace")
    resource_spans = body.get("batches", body.get("resourceSpans"))
    if not isinstance(resource_spans, list):
        raise TempoError(f"{where}: no batches/resourceSpans in the answer")
    try:  # before the recursive id rewrite: a hostile depth is an error, not a RecursionError
        otlp_decode.check_depth({"resourceSpans": resource_spans})
    except otlp_decode.OTLPDecodeError as exc:
        raise TempoError(f"{where}: {exc}") from None
    request = {"resourceSpans": [_hex_ids(rs) for rs in resource_spans]}
    try:
        return otlp_decode.decode_trace_request(otlp_decode.trace_request_from_json(request))
    except otlp_decode.OTLPDecodeError as exc:
        raise TempoError(f"{where}: {exc}") from None


def _hex_ids(node: Any) -> Any:
    """Tempo's v1 JSON carries ids in base64 (protobuf JSON); OTLP/JSON wants hex."""
    if isinstance(node, list):
        return [_hex_ids(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key in _ID_FIELDS and isinstance(value, str):
            out[key] = _to_hex(value)
        else:
            out[key] = _hex_ids(value)
    return out


def _to_hex(value: str) -> str:
    if len(value) in (16, 32) and all(c in "0123456789abcdefABCDEF" for c in value):
        return value.lower()
    try:
        return base64.b64decode(value, validate=True).hex()
    except (binascii.Error, ValueError):
        return value  # left for the decoder to reject with its own message
