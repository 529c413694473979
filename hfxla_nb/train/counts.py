"""The torch_xla metrics a fine-tune run counts: compiles, executions and transfers."""

EXECUTE = ("ExecuteTime", "ExecuteReplicatedTime")
COUNTED = ("CompileTime", *EXECUTE, "TransferFromDeviceTime", "TransferToDeviceTime")
