"""Where `analyze` reads traces from: the embedded store, an OTLP JSON file, or a Tempo.

Analysis consumes one trace at a time (``iter_traces``), so a large store is read as a stream
through the store's own reading API and the backend can change under it. A Tempo source finds
the relevant traces with TraceQL and fetches each one by id.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

from otel_ttft.tools import cliargs
from otel_ttft.tools.analysis import traces

TraceSpans = list[dict]


class SourceError(ValueError):
    """A source that cannot be read: missing, not spans, unreachable. One line, for the user."""


def is_url(source: str | Path) -> bool:
    """Whether the source is meant as a URL (then it must be a valid one: ``check_url``)."""
    return isinstance(source, str) and source[:8].lower().startswith(("http://", "https://"))


def check_url(source: str) -> str:
    """A Tempo base URL that parses (host, port in range); SourceError with one line if not."""
    try:
        return cliargs.http_url(source)
    except argparse.ArgumentTypeError as exc:
        raise SourceError(str(exc)) from None


def iter_traces(source: str | Path, *, since_s: float | None = None,
                limit: int | None = None, timeout_s: float | None = None
                ) -> Iterator[TraceSpans]:
    """The spans of one trace per item, from a store directory, a spans/OTLP JSON file or a
    Tempo base URL (``since_s``/``limit`` bound the Tempo search, ``timeout_s`` each answer)."""
    if is_url(source):
        from otel_ttft.tools.analysis.tempo import TempoError, iter_tempo_traces

        base = check_url(str(source))
        try:
            yield from iter_tempo_traces(base, since_s=since_s, limit=limit,
                                         timeout_s=timeout_s)
        except TempoError as exc:
            raise SourceError(str(exc)) from None
        return
    try:
        yield from traces.iter_traces(source)
    except traces.TraceFileError as exc:
        raise SourceError(str(exc)) from None
