"""Embedded OTLP receiver and append-only local store: telemetry with no stack to run."""
