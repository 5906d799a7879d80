"""OTLP metric points from the embedded store, as the Collector's ``prometheus`` exporter shows them."""
