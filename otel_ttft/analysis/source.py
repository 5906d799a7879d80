"""Where `analyze` reads traces from: the embedded store, an OTLP JSON file, or a Tempo.

Analysis consumes one trace at a time (``iter_traces``), so a large store is read as a stream
through the store's own reading API and the backend can change under it. A Tempo source finds
the relevant traces with TraceQL and fetches each one by id.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

from otel_ttft.analysis import traces

TraceSpans = list[dict]


class SourceError(ValueError):
    """A source that cannot be read: missing, not spans, unreachable. One line, for the user."""


def is_url(source: str) -> bool:
    return urlsplit(source).scheme in ("http", "https")


def iter_traces(source: str | Path, *, since_s: float | None = None,
                limit: int | None = None) -> Iterator[TraceSpans]:
    """The spans of one trace per item, from a store directory, a spans/OTLP JSON file or a
    Tempo base URL (``since_s``/``limit`` bound the Tempo search)."""
    if isinstance(source, str) and is_url(source):
        from otel_ttft.analysis.tempo import TempoError, iter_tempo_traces

        try:
            yield from iter_tempo_traces(source, since_s=since_s, limit=limit)
        except TempoError as exc:
            raise SourceError(str(exc)) from None
        return
    try:
        yield from traces.iter_traces(source)
    except traces.TraceFileError as exc:
        raise SourceError(str(exc)) from None
