"""Which torch_xla metrics a fine-tune run counts: compiles, executions and transfers.

The names themselves are torch_xla's, written once in `_xla`; this module only chooses.
"""

from .._xla import COMPILE_TIME, EXECUTE_TIMES, TRANSFER_FROM_DEVICE_TIME, TRANSFER_TO_DEVICE_TIME

EXECUTE = EXECUTE_TIMES
COUNTED = (COMPILE_TIME, *EXECUTE, TRANSFER_FROM_DEVICE_TIME, TRANSFER_TO_DEVICE_TIME)
