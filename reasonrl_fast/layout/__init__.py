"""The run's shape, decided once, without torch: `resolve(cfg, model_config, device, world,
engine) -> Layout` (resolve.py: sharding, dtypes, attention, packing, the fused head, the engine's
memory and tensor parallelism), the mini-batch rule (batches.py) and the micro-batches by token
budget (micro.py). The trainer's workers build from these, eval samples with them, config's
checks, preflight and the planner (plan.py) read them: none of them restates a rule. Nothing in
this package imports torch (tests/layout/test_resolve.py imports it and checks that torch stays
out), and it reads a model by its config alone (shape.py: the config.json fields, or a shipped
shape for a model that is not on the machine)."""

from reasonrl_fast.layout.batches import (SYNC_BUCKET_BYTES, largest_mini_batch, mini_batch_count, mini_batches,
                                          tokens_per_forward)
from reasonrl_fast.layout.resolve import (FUSED_CPU_MIN_ELEMENTS, PACKED_FAMILIES, SCALES, SOFTCAPS, Layout,
                                          attention, compute_dtype, config_head_blocker, dtype_bytes, fused_head,
                                          master_dtype, packing, packing_blocker, refuse_fused_head, refuse_packing,
                                          refuse_sequence_parallel, resolve, sharding_mode, tensor_parallel)

__all__ = ["FUSED_CPU_MIN_ELEMENTS", "PACKED_FAMILIES", "SCALES", "SOFTCAPS", "SYNC_BUCKET_BYTES", "Layout",
           "attention", "compute_dtype", "config_head_blocker", "dtype_bytes", "fused_head", "largest_mini_batch",
           "master_dtype", "mini_batch_count", "mini_batches", "packing", "packing_blocker", "refuse_fused_head",
           "refuse_packing", "refuse_sequence_parallel", "resolve", "sharding_mode", "tensor_parallel", "tokens_per_forward"]
