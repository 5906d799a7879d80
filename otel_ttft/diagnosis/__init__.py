"""The verdict, once for every reader: which stage expanded first and what to change, in the
installed vLLM's own words.

Pure: inputs are stage durations and evidence (records as plain dicts), never a store or a trace
file; it imports only the vocabulary (``semconv``). ``otel-ttft analyze`` applies it to the
requests of a replay, the runtime (``otel_ttft.runtime.hooks.activation_verdict``) to each
activation against the earlier ones on its host:

- ``rule``: the article's rule (earliest stage beyond the noise, the chain with shares, the
  guards, the fix per sub-stage);
- ``evidence``: the facts beside a verdict and the guards' notes;
- ``thresholds``: the alert rules' factor and minimum seconds, for a baseline too thin to
  measure its noise;
- ``change`` / ``change_rules``: the concrete change (flags, environment variables, driver);
- ``vocabulary``: the installed vLLM's knobs as data (read once per vLLM version by
  ``otel_ttft.tools.vllm_vocabulary``); ``vocabulary_store``: the data shipped for each version
  (``vllm_vocabulary/VERSION.json``), else that reader run once in a subprocess and kept on disk;
- ``record``: an activation's record (stage intervals, facts, validation), light enough for the
  runtime to import at start-up;
- ``activation``: an activation as a record the rule takes, and the verdict in plain words.

No argument parser, no source reading (``make lint`` bans them here): vLLM's processes import this.
"""
