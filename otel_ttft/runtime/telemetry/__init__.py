"""Span and metric machinery shared by every hook: spans on the one clock (``spans``), OTel
instruments (``metrics``), open activation spans kept across hangs and crashes (``inflight``), the
processors our configurator puts first (``pipeline``), and its export pipeline with an exit that
never holds vLLM (``bounded_export``). Public OpenTelemetry API only."""
