"""Checkpoint loading: per-shard reads, storage evidence, host-to-device copies, the rest of
``Load model``, and the load metrics."""


SPAN_SHARD_READ = "Read checkpoint shard"  # one checkpoint shard (file) read, whatever the loader
#: post-processing after loading (quantization, repacking): load.process
SPAN_PROCESS_WEIGHTS = "Process weights after loading"

# checkpoint reads: on Read checkpoint shard spans and the Load weights around them
ATTR_LOAD_FORMAT = "ttft.load.format"  # on shard spans: vLLM's --load-format (safetensors, pt, ...)
ATTR_SHARD_PATH = "ttft.load.shard.path"  # on shard spans: the file read
ATTR_SHARD_INDEX = "ttft.load.shard.index"  # on shard spans: its place in the read order
#: on shard spans: size on disk; the shards sum to the checkpoint
ATTR_SHARD_BYTES = "ttft.load.shard.bytes"
ATTR_SHARD_TENSORS = "ttft.load.shard.tensors"  # on shard spans: tensors read
ATTR_READ_SECONDS = "ttft.load.read.seconds"  # shard, Load weights: s inside the reader only
ATTR_READ_GB_PER_S = "ttft.load.read.gb_per_s"  # on shard spans: bytes / read seconds
#: on shard spans and Load weights: the mount's file system (ext4, nfs4, ...)
ATTR_FS_TYPE = "ttft.load.fs.type"
#: on shard spans: 0..1 of the file in page cache before its first read (mincore): 0 = cold read;
#: on Load weights, byte-weighted over the shards
ATTR_PAGE_CACHE_RESIDENT = "ttft.load.page_cache.resident_ratio"
#: on shard spans and Load weights: the same once the file's read ended (1.0: all of it cached)
ATTR_PAGE_CACHE_RESIDENT_AFTER = "ttft.load.page_cache.resident_ratio_after"
#: on shard spans and Load weights (safetensors): bytes of the tensors' memory map that were not
#: in the page cache when the reader handed them over, read from storage inside the read stage
#: (faulted in there, not in the copy to the device)
ATTR_LOAD_FAULTED_BYTES = "ttft.load.faulted.bytes"
#: on Load weights: seconds the consumer held the tensors (copying into the parameters; on a
#: GPU the host-to-device copy), storage reads left out
ATTR_LOAD_COPY_SECONDS = "ttft.load.copy.seconds"
ATTR_LOAD_SHARDS = "ttft.load.shards"  # on Load weights: shards read
ATTR_LOAD_BYTES = "ttft.load.bytes"  # on Load weights: bytes read
#: on Load weights: effective throughput over the whole pass
ATTR_LOAD_GB_PER_S = "ttft.load.gb_per_s"
#: on Process weights after loading: parameter bytes the model holds once loaded and processed
ATTR_LOAD_MODEL_BYTES = "ttft.load.model.bytes"

ATTR_H2D_BYTES = "ttft.h2d.bytes"  # on Load weights (GPU): tensor bytes copied to the device

ATTR_H2D_GB_PER_S = "ttft.h2d.gb_per_s"  # on Load weights (GPU): the consumer-side copy rate
#: counter, By, by ttft.stage and gen_ai.request.model: checkpoint bytes read
METRIC_LOAD_READ_BYTES = "ttft.load.read.bytes"
#: histogram, GBy/s (THROUGHPUT_BUCKETS_GB_PER_S), by ttft.stage and gen_ai.request.model:
#: per-shard read throughput
METRIC_LOAD_READ_THROUGHPUT = "ttft.load.read.throughput"
#: explicit buckets of ttft.load.read.throughput
THROUGHPUT_BUCKETS_GB_PER_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64)
SPAN_LOAD_WEIGHTS = "Load weights"  # vLLM's name; ours for loaders that open none (runai, ...)
SPAN_RELEASE_MEMORY = "Release memory"  # gc.collect / empty_cache inside "Load model"
SPAN_FINALIZE_LAYERWISE = "Finalize layerwise processing"  # online quantization
SPAN_MODEL_EVAL = "model.eval"  # model.eval() inside Load model
SPAN_ONLINE_QUANT_CHECK = "Online quantization check"  # its first call imports the package
ATTR_LOAD_RELEASE_CALL = "ttft.load.release.call"  # gc.collect | empty_cache
ATTR_LOAD_READER = "ttft.load.reader"  # safe_open | threads | torch.load | runai_streamer | ...
ATTR_LOAD_READ_UNION_SECONDS = "ttft.load.read.union_seconds"  # wall time some read was running
ATTR_LOAD_READ_AGGREGATE_GB_PER_S = "ttft.load.read.aggregate_gb_per_s"  # bytes / union seconds
#: on Load weights: bytes on disk of every file of the read kind in the checkpoint folder (bytes
#: read below this: a filter skipped shards)
ATTR_CHECKPOINT_BYTES = "ttft.load.checkpoint.bytes"
ATTR_FS_REMOTE = "ttft.load.fs.remote"  # network or FUSE file system
ATTR_BLOCK_DEVICE = "ttft.load.block_device"  # e.g. nvme0n1, where /sys shows it
#: the block device spins (False for SSD and NVMe)
ATTR_BLOCK_ROTATIONAL = "ttft.load.block_device.rotational"
