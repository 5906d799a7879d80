"""The forecast, where routers read it: a gauge per model of this host, and the evictions it
rests on.

Once the API server is ready, ``ttft.switch.forecast`` reports, for every other model in this
host's activation history, what its first token would cost if a request for it arrived now (this
server leaving first), stage by stage (``otel_ttft.diagnosis.forecast``, the conditions read by
``forecast_conditions``). Computed off the request path: in a thread begun at ready, then again
when the gauge is read and the last reading is older than ``REFRESH_S``, in a thread of its own
(the gauge reports the last one meanwhile); each reading is bounded (a history of at most
1 MiB, one ``mincore`` per shard, the process list).

The switch stage of those forecasts is this server's own eviction: when a stop signal ends it
(``hooks/switch.py``), its seconds join the history as a record of kind ``switch``.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any

from opentelemetry.metrics import CallbackOptions, Observation

from otel_ttft import semconv
from otel_ttft.runtime import activation_history as history
from otel_ttft.runtime.telemetry import metrics

logger = logging.getLogger("vllm.otel_ttft")

PART = "forecast"
REFRESH_S = 60.0
MAX_MODELS = 16  # models reported per server, the most recently started first
DRIVER = "restart"  # how this host's records brought a model in (wake-ups are not recorded)


def history_path() -> Any:
    """The history file as this server's verdict reads it."""
    try:
        import vllm.envs as envs

        root = str(envs.VLLM_CACHE_ROOT)
    except Exception:  # noqa: BLE001 - no vLLM cache root: only an explicit path
        root = None
    return history.default_path(root)


class ForecastGauge:
    """The ``forecast`` part (API server): the latest forecasts' observations, refreshed off the
    request path, and this server's eviction noted in the history."""

    def __init__(self, process_state: Any) -> None:
        self._config = process_state.config
        self._identity = process_state.identity  # the model this server serves
        self._feed: Any = None
        self._observations: list[tuple[float, dict]] = []
        self._read_at = 0.0
        self._reading: threading.Thread | None = None
        self._lock = threading.Lock()
        self._libc: Any = None  # found once (ldconfig), kept for every reading
        self._closed = False

    def on_ready(self) -> None:
        """The server is ready: read once in a thread; the gauge reports from now on."""
        if self._closed or not history.enabled():
            return
        self._refresh()
        if self._feed is None:
            self._feed = metrics.observable(
                self._config, semconv.METRIC_SWITCH_FORECAST, self._observe, unit="s",
                description="Forecast of another model's first token on this host if a request "
                            "for it arrived now (this server leaving first), per stage")

    def _refresh(self) -> None:
        with self._lock:
            if self._reading is not None and self._reading.is_alive():
                return
            self._read_at = time.monotonic()
            self._reading = threading.Thread(target=self._read, name="otel-ttft-forecast",
                                             daemon=True)
            self._reading.start()

    def _read(self) -> None:
        try:
            from otel_ttft.runtime.hooks import forecast_conditions as conditions

            path = history_path()
            loaded = history.load(path) if path is not None else None
            if loaded is None or not loaded.records:
                self._observations = []
                return
            mine = self._identity.served_model
            host = conditions.read_host(libc=self._libc)
            self._libc = host.libc
            found = conditions.forecasts(loaded.records, host, outgoing=mine)
            found = [f for f in found if f.model != mine and f.total_s is not None]
            self._observations = observations(found[-MAX_MODELS:])
        except Exception:  # noqa: BLE001 - a forecast is never an error for the server
            logger.debug("otel-ttft: no forecast", exc_info=True)

    def _observe(self, options: CallbackOptions):
        if time.monotonic() - self._read_at > REFRESH_S:
            self._refresh()
        for value, labels in self._observations:
            yield Observation(value, labels)

    def note_eviction(self, start_ns: int, end_ns: int) -> None:
        """This server's eviction ended: its seconds join the history (a ``switch`` record),
        under the history's bounded lock. At exit: never raises."""
        model = self._identity.served_model
        if self._closed or not model or not history.enabled() or end_ns <= start_ns:
            return
        try:
            path = history_path()
            if path is None:
                return
            seconds = round((end_ns - start_ns) / 1e9, 6)
            problem = history.save(path, {
                "id": uuid.uuid4().hex, "key": f"switch:{model}"[:300], "model": model,
                "kind": "switch", "at": round(time.time(), 3),
                "started_at": round(start_ns / 1e9, 3), "ended_at": round(end_ns / 1e9, 3),
                "duration_s": seconds,
                "stages": {semconv.STAGE_SWITCH: seconds}, "evidence": {}, "facts": {}})
            if problem:
                logger.debug("otel-ttft: eviction not kept: %s", problem)
        except Exception:  # noqa: BLE001
            logger.debug("otel-ttft: eviction not kept", exc_info=True)

    def close(self) -> None:
        """Report nothing more; the gauge is fed by nothing."""
        self._closed = True
        if self._feed is not None:
            metrics.stop_feeding(self._feed, self._observe)
            self._feed = None
        self._observations = []


def observations(found: list[Any]) -> list[tuple[float, dict]]:
    """The gauge's points: per model, each stage's expected seconds, and the total's expected,
    low and high (``ttft.forecast.bound``)."""
    out = []
    for f in found:
        base = {semconv.GEN_AI_REQUEST_MODEL: f.model, semconv.ATTR_FORECAST_DRIVER: DRIVER,
                semconv.ATTR_FORECAST_BASIS_COUNT: f.basis_count}
        for stage, s in f.stages.items():
            out.append((s.expected_s, {**base, semconv.ATTR_STAGE: stage,
                                       semconv.ATTR_FORECAST_BOUND: "expected"}))
        for bound, value in zip(semconv.FORECAST_BOUNDS, (f.total_s, f.low_s, f.high_s),
                                strict=True):
            out.append((value, {**base, semconv.ATTR_STAGE: semconv.FORECAST_STAGE_TOTAL,
                                semconv.ATTR_FORECAST_BOUND: bound}))
    return out
