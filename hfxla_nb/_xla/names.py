"""torch_xla's metric and counter names (torch_xla 2.8 and 2.9, XLA on the CPU and TPU),
written only here: `observe.metrics` summarizes them, fine_tune's loop counts some
(`train.counts`). A rename upstream is one edit. Plain strings: importing this imports nothing.
"""

from __future__ import annotations

# Metrics (`torch_xla.debug.metrics.metric_data`: a count, a total, the latest samples).
COMPILE_TIME = "CompileTime"  # one sample (ns) per compilation
EXECUTE_TIMES = ("ExecuteTime", "ExecuteReplicatedTime")  # one per execution (SPMD: replicated)
TRANSFER_FROM_DEVICE_TIME = "TransferFromDeviceTime"  # one per device-to-host transfer
TRANSFER_TO_DEVICE_TIME = "TransferToDeviceTime"  # one per host-to-device transfer
BYTES_FROM_DEVICE = "InboundData"  # bytes of those transfers
BYTES_TO_DEVICE = "OutboundData"

# Counters (`counter_value`): the fallbacks where a metric above is missing, and the rest.
UNCACHED_COMPILE = "UncachedCompile"  # compilations
CACHED_COMPILE = "CachedCompile"  # graphs found in the in-memory computation cache
EXECUTE_COUNTERS = ("ExecuteComputation", "ExecuteReplicated")  # executions
MARK_STEP = "MarkStep"  # `torch_xla.sync()` / `xm.mark_step()` calls
FALLBACK_PREFIX = "aten::"  # every op that ran on the CPU has a counter `aten::<op>`
ITEM_OP = "aten::_local_scalar_dense"  # what `.item()` shows up as among those fallbacks
# The persistent compile cache: hits, misses, and entries this XLA could not load.
PERSISTENT_CACHE_COUNTERS = {"hits": "PersistentCacheHit", "misses": "PersistentCacheMiss",
                             "unreadable": "PersistentCacheDeserializeFailure"}
