"""The warm-up regression thresholds, one place for both readers: the shipped Prometheus rules
(``collector-config/rules/otel-ttft-warmup.yml``, the ``otel_ttft:threshold:warmup_regression_*``
records; a test holds them equal) and the live verdict, which applies them where a host has too
few earlier activations of a model to measure its noise."""

from __future__ import annotations

from dataclasses import dataclass

#: a stage regressed when it took this many times its baseline ...
WARMUP_REGRESSION_FACTOR = 2.0
#: ... and at least this many seconds more (no page for a 5 ms stage becoming 12 ms)
WARMUP_REGRESSION_MIN_SECONDS = 10.0


@dataclass(frozen=True)
class AlertThresholds:
    """What "expanded" means without a measured noise: ``factor`` x the baseline and
    ``min_seconds`` more, per stage; the whole start must be ``min_seconds`` slower."""

    factor: float = WARMUP_REGRESSION_FACTOR
    min_seconds: float = WARMUP_REGRESSION_MIN_SECONDS

    def stage_noise(self, baseline_s: float) -> float:
        """The largest increase still within the thresholds for a stage of ``baseline_s``."""
        return max(self.min_seconds, (self.factor - 1.0) * max(baseline_s, 0.0))


ALERT_THRESHOLDS = AlertThresholds()


#: a prefill step's wait for a CPU is named (``prefill.wait``) only when it is at least this long
#: ... (below it, clock and scheduler jitter: a tiny model's step waits 0.1-1 ms anyway)
STEP_WAIT_MIN_SECONDS = 0.005
#: ... and the worker thread ran for at most this share of the step's wall time (a healthy CPU
#: step runs 0.9-1.0 of it; another process taking half the core leaves 0.5)
STEP_WAIT_MAX_CPU_RATIO = 0.8


def waited(window_s: float, wait_s: float) -> bool:
    """Whether ``wait_s`` without a CPU within ``window_s`` is a wait worth a name: at least
    ``STEP_WAIT_MIN_SECONDS`` and more than the share of the window a healthy step loses."""
    return (wait_s >= STEP_WAIT_MIN_SECONDS
            and wait_s >= (1.0 - STEP_WAIT_MAX_CPU_RATIO) * window_s)


#: one worker rank gated a start when, in one start-up stage, it took this many times the
#: fastest rank's time ... (the shipped alert ``OtelTtftRankSkew`` uses the same; a test holds
#: them equal)
RANK_SKEW_FACTOR = 2.0
#: ... and at least this many seconds more (ranks that import or load a second apart are noise)
RANK_SKEW_MIN_SECONDS = 1.0


#: a step's hand-off (EngineCore handed it over -> its worker began it, plus the worker's output
#: left -> EngineCore had it) is a wait only beyond this many seconds: a worker asleep between
#: requests is woken through its queue in well under it
HANDOFF_MIN_SECONDS = 0.05
#: a wait is named as paged-in memory (major_faults) from this many major faults in its window
WAIT_MAJOR_FAULTS = 100
