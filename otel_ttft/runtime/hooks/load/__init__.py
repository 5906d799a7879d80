"""The ``load`` stage family: checkpoint reads per shard (``shards``, with page-cache residency
from ``pagecache`` and the device under the files from ``storage``), vLLM's loader formats
(``formats``), ``Load weights`` and host-to-device totals (``weights``), and post-processing
(``finish``). Their one state part, :class:`shards.LoadState`, is handed to every hook here."""

from __future__ import annotations

from otel_ttft.runtime.hooks.load import finish, formats, shards, weights

HOOKS = [*weights.HOOKS, *formats.HOOKS, *finish.HOOKS]
PARTS = [shards.PART]
