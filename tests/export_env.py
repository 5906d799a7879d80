"""How the tests point every vLLM process at the test's OTLP receiver: fast batches, no logs."""

EXPORT_ENV = {
    "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
    "OTEL_BSP_SCHEDULE_DELAY": "200",
    "OTEL_METRIC_EXPORT_INTERVAL": "1000",
    "OTEL_SERVICE_NAME": "vllm-test",
    "OTEL_TRACES_EXPORTER": "otlp",
    "OTEL_METRICS_EXPORTER": "otlp",
    "OTEL_LOGS_EXPORTER": "none",
}
