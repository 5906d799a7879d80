"""Telemetry health: what was not sent, and spans ended by us rather than by vLLM."""


#: on the span open when one of our hooks failed: which hook and why
ATTR_HOOK_ERROR = "ttft.hook.error"
ATTR_SPAN_UNFINISHED = "ttft.span.unfinished"  # True on a snapshot copy of a span still open
ATTR_SPAN_ENDED_BY = "ttft.span.ended_by"  # process_exit | SIGTERM | ... | parent: not by vLLM
#: counter, by ttft.telemetry.signal and ttft.telemetry.drop_reason: spans and metric points
#: this process could not deliver
METRIC_TELEMETRY_DROPPED = "ttft.telemetry.dropped"
ATTR_TELEMETRY_SIGNAL = "ttft.telemetry.signal"  # spans | metrics
ATTR_TELEMETRY_DROP_REASON = "ttft.telemetry.drop_reason"  # queue_full|export_failed|exit_deadline
DROP_QUEUE_FULL = "queue_full"  # ttft.telemetry.drop_reason: the SDK's export queue was full
DROP_EXPORT_FAILED = "export_failed"  # ttft.telemetry.drop_reason: the exporter gave up on a batch
#: ttft.telemetry.drop_reason: not sent by the process's exit deadline
DROP_EXIT_DEADLINE = "exit_deadline"
