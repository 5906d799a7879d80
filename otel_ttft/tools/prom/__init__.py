"""The embedded store's metric points as the Collector's ``prometheus`` exporter shows them."""
