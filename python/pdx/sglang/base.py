"""The shapes of SGLang's transfer-backend types that pdx.sglang needs,
defined here so that it imports without SGLang (sglang/srt/disaggregation/
base/conn.py at 0094505d, docs/sglang.md): the poll states, the KV
arguments a scheduler fills in, the transfer metric, and the failure a
poll() of Failed is explained by.
"""
import enum
from dataclasses import dataclass
from typing import Optional


class KVPoll:
    """SGLang's states, as the ints its schedulers all-reduce (MIN)."""
    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4


class KVArgs:
    """What SGLang's prefill.py / decode.py set before building the
    manager; pdx reads kv_data_*, kv_item_lens, aux_data_*, page_size,
    engine_rank and pp_rank. SGLang's own KVArgs class works as well."""
    engine_rank: int = 0
    pp_rank: int = 0
    system_dp_rank: int = 0
    page_size: int = 1
    gpu_id: int = 0
    kv_head_num: int = 0


@dataclass
class KVTransferMetric:
    transfer_latency_s: Optional[float] = None
    alloc_latency_s: Optional[float] = None
    transfer_total_bytes: Optional[int] = None


class PdxTransferError(Exception):
    """Why a transfer failed: pdx's reason (an agent's event, a refused
    call, the bootstrap answer), with SGLang's room."""

    def __init__(self, bootstrap_room: int, failure_reason: str,
                 is_from_another_rank: bool = False):
        super().__init__(failure_reason)
        self.bootstrap_room = bootstrap_room
        self.failure_reason = failure_reason
        # SGLang logs such a failure at debug: the rank that failed said it
        self.is_from_another_rank = is_from_another_rank

    def __str__(self):
        return "PdxTransferError(bootstrap_room=%s): %s" % (
            self.bootstrap_room, self.failure_reason)


def mode_name(mode) -> str:
    """"prefill" or "decode" from SGLang's DisaggregationMode (or its
    value)."""
    name = getattr(mode, "value", mode)
    if isinstance(name, enum.Enum):
        name = name.value
    if name not in ("prefill", "decode"):
        raise ValueError("pdx.sglang: disaggregation mode %r is neither "
                         "prefill nor decode" % (mode,))
    return name
