"""The end-to-end benchmark's figures for one (load, upstream) cell: per-round ratios to plain
vLLM, their median with a distribution-free interval, the API server's counters per request."""

from __future__ import annotations

import math
import statistics
from collections import Counter


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def median_interval(values: list[float], confidence: float = 0.95
                    ) -> tuple[float | None, float | None]:
    """A distribution-free interval for the median (order statistics: the k-th smallest and
    largest of n, k the largest with P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2); None
    where n is too small for one (n < 6 at 95 %)."""
    n, values = len(values), sorted(values)
    tail, k, below = (1 - confidence) / 2, 0, 0.0
    while k < n // 2:
        nxt = below + math.comb(n, k) / 2 ** n  # P(X < k + 1)
        if nxt > tail:
            break
        below, k = nxt, k + 1
    if k == 0:
        return None, None
    return round(values[k - 1], 4), round(values[n - k], 4)


def cell_figures(results: list[dict], arms: list[str]) -> dict:
    """One (load, upstream) cell: per-round ratios to plain and their median, per process; the
    API server's threads and counters per request (per second when idle); throughput and
    client TTFT."""
    rounds: dict[str, list[dict]] = {arm: [r for r in results if r["arm"] == arm] for arm in arms}
    idle = not results[0]["requests"]

    def per(r: dict) -> float:
        """What a figure is divided by: requests, or seconds of an idle run."""
        return r["wall_s"] if idle else r["requests"]

    def per_req(arm: str, role: str) -> list[float]:
        return [r["cpu_s"][role] / per(r) * 1e3 for r in rounds[arm]]

    def ratio(arm: str, values: dict[str, list[float]], base: str = "plain") -> dict:
        a, b = values[arm], values[base]
        if not any(b):  # nothing to divide by: no ratio
            return {"per_round": [], "median": None}
        pairs = [x / y for x, y in zip(a, b, strict=True) if y]
        low, high = median_interval(pairs)
        return {"per_round": [round(p, 3) for p in pairs],
                "median": round(statistics.median(pairs), 4) if pairs else None,
                "median_95ci": [low, high],
                "difference_ms_median": round(statistics.median(
                    [x - y for x, y in zip(a, b, strict=True)]), 4)}

    out: dict = {"unit": "per second (idle)" if idle else "per request"}
    for role in ("api", "engine", "worker"):
        values = {arm: per_req(arm, role) for arm in arms}
        out[f"cpu_{role}_ms"] = {arm: [round(v, 3) for v in values[arm]]
                                             for arm in arms}
        out[f"cpu_{role}_ratio"] = {arm: ratio(arm, values) for arm in arms if arm != "plain"}
        if "off" in arms and "ours" in arms:  # the same process, our hooks on / off
            out[f"cpu_{role}_ours_to_off"] = ratio("ours", values, "off")
    if not idle:
        rps = {arm: [r["requests"] / r["wall_s"] for r in rounds[arm]] for arm in arms}
        out["throughput_req_s"] = {arm: round(statistics.median(rps[arm]), 2) for arm in arms}
        out["throughput_ratio"] = {arm: ratio(arm, rps) for arm in arms if arm != "plain"}
        ttft = {arm: [t for r in rounds[arm] for t in r["ttft_s"]] for arm in arms}
        out["ttft_p50_ratio"] = {arm: round(pct(ttft[arm], .5) / pct(ttft["plain"], .5), 4)
                                 for arm in arms if arm != "plain"}
    per_request: dict[str, dict[str, float]] = {}
    for arm in arms:
        c: Counter[str] = Counter()
        for r in rounds[arm]:
            share = 1 / per(r) / len(rounds[arm])
            for key, value in r["api_counters"].items():
                c[key] += value * share
            for tid, sec in r["api_threads_s"].items():
                c["cpu_ms:" + r["threads"].get(tid, "other threads")] += sec * 1e3 * share
            for key in ("collections", "gc_cpu_s"):
                for gen, value in enumerate(r.get("gc", {}).get(key, ())):
                    scale = 1e3 if key == "gc_cpu_s" else 1
                    c[f"gc_{'cpu_ms' if scale > 1 else 'collections'}_gen{gen}"] += (
                        value * scale * share)
        per_request[arm] = {k: round(v, 4) for k, v in sorted(c.items())}
    out["api_counters_mean"] = per_request
    metered = [r["own_us"] for r in rounds.get("ours", []) if "own_us" in r]
    if metered:  # --meter: our frames' own CPU in the API server, per request
        own = [m["api_server"] for m in metered]
        low, high = median_interval(own)
        out["own_us_per_request"] = {
            "per_round": [round(v, 1) for v in own], "median": round(statistics.median(own), 1),
            "median_95ci": [low, high],
            "by_hook_median": {h: round(statistics.median(m["by_hook"].get(h, 0.0)
                                                          for m in metered), 2)
                               for h in sorted({h for m in metered for h in m["by_hook"]})}}
    return out
