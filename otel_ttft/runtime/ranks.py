"""Which rank of its engine a worker process is: vLLM's world, tensor-, pipeline- and
data-parallel rank and group sizes, as vLLM set them at worker init (``hooks.ranks``).

A leaf, like ``context``: every span this process tags and every per-stage metric it records
reads the ranks here, so two workers' identical "Load model" spans say which is which.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from otel_ttft import semconv


@dataclass(frozen=True)
class Ranks:
    """vLLM's ranks of this worker; None where not known yet (the tensor- and pipeline-parallel
    ranks exist once vLLM built its parallel groups, inside "Init device")."""

    rank: int | None = None
    world_size: int | None = None
    tp_rank: int | None = None
    tp_size: int | None = None
    pp_rank: int | None = None
    pp_size: int | None = None
    dp_rank: int | None = None
    dp_size: int | None = None

    def merged(self, **known: int | None) -> Ranks:
        """These ranks with ``known``'s values where they are not None."""
        return replace(self, **{k: v for k, v in known.items() if v is not None})

    def attributes(self) -> dict[str, int]:
        """Every known rank and size, as span attributes."""
        return {key: value for key, value in zip(semconv.PARALLEL_ATTRIBUTES,
                                                 (getattr(self, f.name) for f in fields(self)),
                                                 strict=True) if value is not None}

    def labels(self) -> dict[str, int]:
        """The ranks a metric carries as labels."""
        attrs = self.attributes()
        return {k: attrs[k] for k in semconv.PARALLEL_METRIC_LABELS if k in attrs}


class RankState:
    """The ``ranks`` part: this process's ranks once a worker hook read them (``ranks`` stays
    None in the API server and EngineCore). Closing it forgets them."""

    def __init__(self, process_state: Any = None) -> None:
        global _open
        self.ranks: Ranks | None = None
        self.tracer = getattr(process_state, "tracer", None)  # the rendezvous span's
        self.identity = getattr(process_state, "identity", None)
        _open = self

    def note(self, **known: int | None) -> Ranks:
        """vLLM told us some of this worker's ranks; returns all known now."""
        self.ranks = (self.ranks or Ranks()).merged(**known)
        return self.ranks

    def close(self) -> None:
        global _open
        self.ranks = None
        if _open is self:
            _open = None


PART = "ranks"

_open: RankState | None = None
"""The open part, for the callers no part can be handed to: the span tagging every family uses
(``telemetry.spans.tag_span``), and the stage tagger and stage metrics, which belong to a
provider that outlives any one instrumentation."""


def span_attributes() -> dict[str, int]:
    """This worker's ranks as span attributes ({} outside a worker, or before vLLM said)."""
    part = _open
    ranks = part.ranks if part is not None else None
    return ranks.attributes() if ranks is not None else {}


def metric_labels() -> dict[str, int]:
    """This worker's ranks as metric labels ({} outside a worker)."""
    part = _open
    ranks = part.ranks if part is not None else None
    return ranks.labels() if ranks is not None else {}
