"""The replay client (``otel-ttft replay``): its run and request spans, scenarios, drivers and the
client TTFT metric."""


#: service.name of the replay client's own traces and metrics
REPLAY_SERVICE_NAME = "otel-ttft-replay"
SPAN_REPLAY_RUN = "replay.run"  # one per run, root of its own trace: the run's fixed settings
SPAN_REPLAY_REQUEST = "replay.request"  # CLIENT, root of the request's trace; parent of llm_request
ATTR_REPLAY_RUN_ID = "ttft.replay.run_id"  # joins a run and its requests
ATTR_REPLAY_DRIVER = "ttft.replay.driver"  # restart | sleep | resident | proxy
ATTR_REPLAY_MODELS = "ttft.replay.models"  # served model (and adapter) names
ATTR_REPLAY_CLIENT = "ttft.replay.client"  # client name and version
ATTR_REPLAY_SAMPLING = "ttft.replay.sampling"  # JSON: temperature, max_tokens, seed
ATTR_REPLAY_CONCURRENCY = "ttft.replay.concurrency"  # requests sent at once per step
ATTR_REPLAY_PROMPTS = "ttft.replay.prompts"  # JSON: {"short": {"tokens", "sha256"}, ...}; no text
ATTR_REPLAY_REPEAT = "ttft.replay.repeat"  # runs of each switching scenario (--repeat)
ATTR_REPLAY_REPEAT_WARM = "ttft.replay.repeat_warm"  # runs of each cheap scenario (--repeat-warm)
ATTR_REPLAY_COLD_REQUESTS = "ttft.replay.cold_requests"  # the servers' OTEL_TTFT_COLD_REQUESTS
ATTR_REPLAY_SCENARIOS = "ttft.replay.scenarios"  # the run's scenarios, in order
#: JSON: how to run the replay again (driver, templates with secrets redacted, models, prompt
#: sizing, timeouts): what `otel-ttft verify` re-runs a scenario from
ATTR_REPLAY_SETUP = "ttft.replay.setup"
ATTR_REPLAY_SCENARIO = "ttft.replay.scenario"  # the request's scenario
ATTR_REPLAY_REPEAT_INDEX = "ttft.replay.repeat_index"  # which repeat of its scenario
ATTR_REPLAY_PROMPT = "ttft.replay.prompt"  # short | long
ATTR_REPLAY_SWITCH_FROM = "ttft.replay.switch_from"  # the model served before this request
ATTR_REPLAY_ERROR = "ttft.replay.error"  # why the request failed (status ERROR)
# How the step's server was warmed: untimed requests the replay sent it for this step, and the
# requests it had answered since it (re)started before this one (as far as the replay knows).
#: untimed requests the replay sent this step's server before the timed one
ATTR_REPLAY_WARMUP_REQUESTS = "ttft.replay.warmup.requests"
#: requests that server had answered since it last (re)started, before this one
ATTR_REPLAY_WARMUP_SERVED = "ttft.replay.warmup.served"
# A cold step: the checkpoint's page-cache residency measured right before the server starts
# (after the eviction, retried once), and whether it counts as cold (<= COLD_RESIDENT_MAX).
ATTR_REPLAY_EVICT_RESIDENT = "ttft.replay.evict.resident_ratio"  # 0..1
ATTR_REPLAY_EVICT_ATTEMPTS = "ttft.replay.evict.attempts"  # evictions made before the start
ATTR_REPLAY_EVICT_COLD = "ttft.replay.evict.cold"  # bool: resident share <= COLD_RESIDENT_MAX
ATTR_REPLAY_EVICT_HELD_BY = "ttft.replay.evict.held_by"  # processes mapping the files: "pid name"
ATTR_CLIENT_TTFT = "ttft.client.time_to_first_token"  # s: request made -> first content chunk
ATTR_CLIENT_REQUEST_SENT_NS = "ttft.client.request_sent_ns"  # epoch ns (one clock): HTTP sent

# Replay scenarios (the article's five, plus multi-adapter servers).
#: A warm, then B with its page cache and compile caches dropped
SCENARIO_COLD_SWITCH = "cold-switch"
SCENARIO_SWITCH_BACK = "switch-back"  # right after cold-switch, back to A (its caches survived)
SCENARIO_RESIDENT_DUAL = "resident-dual"  # A and B both up and warm
SCENARIO_SHORT_PROMPT = "short-prompt"  # A alone and warm, short prompt: the default baseline
SCENARIO_LONG_PROMPT = "long-prompt"  # A alone and warm, a prompt that fills the context
#: A with two LoRA adapters and one slot: the second, then the first
SCENARIO_ADAPTER_SWITCH = "adapter-switch"
#: the replay scenarios, in replay order (the article's five, plus multi-adapter servers)
SCENARIOS = (SCENARIO_COLD_SWITCH, SCENARIO_SWITCH_BACK, SCENARIO_RESIDENT_DUAL,
             SCENARIO_SHORT_PROMPT, SCENARIO_LONG_PROMPT, SCENARIO_ADAPTER_SWITCH)
DRIVERS = ("restart", "sleep", "resident", "proxy")  # how a replay switches models
# Each repeat of these costs a server start (or a wake): repeated --repeat times; every other
# scenario is cheap (requests to a running server, an adapter load) and runs --repeat-warm times.
#: the scenarios that cost a server start each repeat (run --repeat times)
SCENARIOS_SWITCHING = (SCENARIO_COLD_SWITCH, SCENARIO_SWITCH_BACK)
COLD_RESIDENT_MAX = 0.05  # share of a checkpoint in the page cache that still counts as cold

#: histogram, s (TTFT_BUCKETS_S): the replay client's TTFT (GenAI semconv client metric,
#: streaming calls), request made -> first content chunk, the value of
#: ttft.client.time_to_first_token; by gen_ai.operation.name, gen_ai.request.model,
#: ttft.replay.scenario and ttft.request.cold (here: the request waited for a switch or a cold
#: start)
METRIC_CLIENT_TIME_TO_FIRST_CHUNK = "gen_ai.client.operation.time_to_first_chunk"
#: JSON on a switching step's replay.request: the forecast of its model's first token read just
#: before the switch (otel-ttft forecast's JSON for that model: total, stages, range, basis)
ATTR_REPLAY_FORECAST = "ttft.replay.forecast"
