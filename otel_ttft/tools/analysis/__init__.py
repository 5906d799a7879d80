"""Spans in (store, OTLP JSON) -> trees, coverage, per-stage time -> text."""
