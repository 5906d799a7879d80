"""The EngineCore -> API payload: what EngineCore noted about one request, carried as one entry
in the ``trace_headers`` of the request's first ``EngineCoreOutput``."""

from __future__ import annotations

from typing import Any


def encode(st: Any) -> str:
    """One request's EngineCore record (``engine._EngineReq``) as a header value."""
    parts = [f"q={st.queued!r}", f"n={st.attempts}", f"w={st.waiting}",
             f"r={st.running}", f"b={st.free}", f"t={st.total}"]
    if st.schedule:
        parts.append("e=" + ",".join(st.schedule))
    if st.adapter is not None:
        parts.append(f"a={st.adapter[0]!r},{st.adapter[1]!r}")
    if st.compile:
        parts.append("c=" + ",".join(st.compile))
    return ";".join(parts)


def decode(payload: str) -> dict[str, Any]:
    """The API side's reading of :func:`encode` (unknown keys ignored)."""
    out: dict[str, Any] = {}
    for part in payload.split(";"):
        key, _, value = part.partition("=")
        if key == "q":
            out["queued"] = float(value)
        elif key in ("n", "w", "r", "b", "t"):
            out[{"n": "attempts", "w": "waiting", "r": "running", "b": "free",
                 "t": "total"}[key]] = int(value)
        elif key == "e":
            out["schedule"] = [(item[0], float(item[1:])) for item in value.split(",") if item]
        elif key == "a":
            start, end = value.split(",")
            out["adapter"] = (float(start), float(end))
        elif key == "c":
            times = [float(t) for t in value.split(",")]
            out["compile"] = list(zip(times[::2], times[1::2], strict=False))
    return out
