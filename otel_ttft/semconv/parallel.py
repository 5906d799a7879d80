"""The engine's workers side by side: which rank a worker span or metric is, in vLLM's own
vocabulary (its parallel groups ``world``, ``tp``, ``pp``, ``dp``, each with ``rank_in_group``
and ``world_size``), and how far the slowest rank fell behind the others in a start-up stage."""


#: on every worker span and per-stage metric: the worker's rank in vLLM's world group (the
#: executor's ``rank``; on metrics, a label)
ATTR_PARALLEL_RANK = "ttft.parallel.rank"
#: ... the world group's size: the workers of one engine (tensor x pipeline parallel)
ATTR_PARALLEL_WORLD_SIZE = "ttft.parallel.world_size"
ATTR_PARALLEL_TP_RANK = "ttft.parallel.tp.rank"  # rank in vLLM's "tp" group (tensor parallel)
ATTR_PARALLEL_TP_SIZE = "ttft.parallel.tp.world_size"  # --tensor-parallel-size
ATTR_PARALLEL_PP_RANK = "ttft.parallel.pp.rank"  # rank in vLLM's "pp" group (pipeline parallel)
ATTR_PARALLEL_PP_SIZE = "ttft.parallel.pp.world_size"  # --pipeline-parallel-size
ATTR_PARALLEL_DP_RANK = "ttft.parallel.dp.rank"  # vLLM's data_parallel_rank ("dp" group)
ATTR_PARALLEL_DP_SIZE = "ttft.parallel.dp.world_size"  # --data-parallel-size
#: the rank attributes, in the order they are printed
PARALLEL_ATTRIBUTES = (
    ATTR_PARALLEL_RANK, ATTR_PARALLEL_WORLD_SIZE, ATTR_PARALLEL_TP_RANK, ATTR_PARALLEL_TP_SIZE,
    ATTR_PARALLEL_PP_RANK, ATTR_PARALLEL_PP_SIZE, ATTR_PARALLEL_DP_RANK, ATTR_PARALLEL_DP_SIZE,
)
#: the rank attributes a worker's metrics carry as labels (the sizes are the same for every
#: series of one engine: a label would add nothing)
PARALLEL_METRIC_LABELS = (ATTR_PARALLEL_RANK, ATTR_PARALLEL_TP_RANK, ATTR_PARALLEL_PP_RANK,
                          ATTR_PARALLEL_DP_RANK)

#: a worker in vLLM's distributed rendezvous (``init_distributed_environment``, inside "Init
#: device"), where it waits for every other rank to arrive: with several workers, time a rank
#: spends here is the slowest rank's, not its own (stage warmup.device_init)
SPAN_RANK_RENDEZVOUS = "Wait for other ranks"
#: True on a span whose time is this rank waiting for the others (a collective)
ATTR_PARALLEL_WAIT = "ttft.parallel.wait"

# the activation along the slowest rank
#: on vllm.activation.verdict: the worker rank that gated the start (its stage took longest)
ATTR_VERDICT_RANK = "ttft.verdict.rank"
#: ... the stage in which it fell behind the others
ATTR_VERDICT_RANK_STAGE = "ttft.verdict.rank_stage"
#: ... how far behind, s: its time in that stage less the fastest rank's
ATTR_VERDICT_RANK_SKEW_S = "ttft.verdict.rank_skew_seconds"
#: gauge, s, by ttft.stage and gen_ai.request.model, per API process: in its latest activation,
#: the slowest worker rank's time in each start-up stage less the fastest rank's (0 with one
#: worker); its ttft.parallel.rank label names the slowest rank
METRIC_ACTIVATION_RANK_SKEW = "ttft.activation.stage.rank_skew"
