"""The tools that run beside vLLM, never inside it: the embedded OTLP receiver and store
(``sink``), the analysis (``analysis``: breakdown, verdict, report, check), the scenario replay
(``replay``), the Prometheus exposition (``prom``), the dashboard generator (``dashboards``) and
the command line (``cli``, ``doctor``). Tools may import the runtime's vocabulary
(``otel_ttft.semconv``) and, where they inspect it, the runtime; the runtime never imports a tool.
"""
