"""Every environment variable otel-ttft reads, one constant each (the contrib habit).

Instrumentation settings, the exit and snapshot deadlines included, are read once, when the
instrumentor runs (``config.Config.from_env``), into one frozen config; a number that does not
parse (NaN included) reads as its default, with a warning. The cache directory is read by the
commands that build the tiny test models. Set them in the environment
of ``vllm serve`` / ``opentelemetry-instrument``: every vLLM process (API server, EngineCore,
workers) inherits them. ``scripts/setup`` alone reads ``OTEL_TTFT_VLLM_FLAVOR`` (``cpu`` or
``cuda``: which vLLM build to install, overriding the GPU detection).
"""

OTEL_TTFT_DISABLED_HOOKS = "OTEL_TTFT_DISABLED_HOOKS"
"""Comma-separated hook names to leave unwrapped (``otel-ttft doctor`` lists the names).
Default: none."""

OTEL_TTFT_COLD_REQUESTS = "OTEL_TTFT_COLD_REQUESTS"
"""How many requests after an activation (start, wake-up, switch) count as cold
(``ttft.request.cold``). Default: 3; a non-number reads as the default, a negative as 0."""

OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT = (
    "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT")
"""``true`` records prompt and output text (``gen_ai.input.messages`` /
``gen_ai.output.messages``) on request spans; anything else, the default, records none. The
GenAI instrumentations' shared name."""

OTEL_TTFT_EXIT_TIMEOUT_MS = "OTEL_TTFT_EXIT_TIMEOUT_MS"
"""Deadline for each vLLM process's final flush at exit, in milliseconds (0 to an hour).
Default: 500."""

OTEL_TTFT_SNAPSHOT_AFTER_S = "OTEL_TTFT_SNAPSHOT_AFTER_S"
"""Export a snapshot of an activation span still open after this many seconds (a hang shows
before it ends); 0 turns snapshots off. Default: 60."""

OTEL_TTFT_CACHE = "OTEL_TTFT_CACHE"
"""Parent directory of the tiny test models that ``python -m otel_ttft.tools.tiny_model``, the
demo and the tests build. Default: ``~/.cache/otel-ttft``."""

OTEL_TTFT_REQUEST_DETAIL = "OTEL_TTFT_REQUEST_DETAIL"
"""Which requests get their ``llm_request`` span (stage durations as attributes) and its stage
child spans; every request is counted in the metrics either way. ``auto`` (default): span and
children for cold, slow, tail, failed requests and a sampled share, and the span for any request
the caller traces (a sampled ``traceparent``); ``spans``: every request's span, children as in
``auto``; ``all``: every request, span and children; ``none``: no children, spans only for the
requests the caller traces. Anything else reads as ``auto``."""

OTEL_TTFT_REQUEST_DETAIL_SLOW_MS = "OTEL_TTFT_REQUEST_DETAIL_SLOW_MS"
"""``auto``/``spans``: a request whose TTFT is above this many milliseconds gets its span and
children. Default: 1000."""

OTEL_TTFT_REQUEST_DETAIL_RATIO = "OTEL_TTFT_REQUEST_DETAIL_RATIO"
"""``auto``/``spans``: the share of the other requests that get their span and children (0..1;
by the caller's trace id when it traces the request). Default: 0.01."""

OTEL_TTFT_CLOCK_OFFSET = "OTEL_TTFT_CLOCK_OFFSET"
"""Not a setting: leave it unset. The first otel-ttft process of a tree (``otel-ttft replay``,
the vLLM API server) sets it, ``BOOT_ID:NANOSECONDS``, for every process it starts, so that all
of them map the monotonic clock to epoch time with one offset and a wall-clock step between
their starts (NTP, a VM restored from a snapshot) cannot shift one process's spans against
another's. A value from an earlier boot, or one that does not parse, is ignored."""

OTEL_TTFT_VERDICT = "OTEL_TTFT_VERDICT"
"""``false`` (or ``0``, ``off``) turns the live verdict off: no activation history is read or
written and activations carry no ``ttft.verdict.*``. Anything else, the default, judges every
start of the API server against the earlier starts of its model and configuration on the host
(docs/verdict.md)."""

OTEL_TTFT_VERDICT_HISTORY = "OTEL_TTFT_VERDICT_HISTORY"
"""The live verdict's activation history file (small, bounded JSON, replaced whole under a file
lock). Default: ``otel-ttft/activations.json`` under vLLM's cache root (``VLLM_CACHE_ROOT``, as
the running vLLM resolves it). A file that is missing, unreadable, not ours, too large or not a
regular file means "no baseline"; one that is not ours is never overwritten."""

DEFAULT_COLD_REQUESTS = 3
DEFAULT_REQUEST_DETAIL_SLOW_MS = 1000.0
DEFAULT_REQUEST_DETAIL_RATIO = 0.01
DEFAULT_EXIT_TIMEOUT_MS = 500
DEFAULT_SNAPSHOT_AFTER_S = 60.0
