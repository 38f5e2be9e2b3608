# Stand-in for vLLM, written from vLLM's source at commit 52a31cc
# (vllm-project/vllm 52a31ccecca203effd490a5b496dc5f8d9496654) for the pdx
# test harness (tests/python/mini_vllm.py). NOT vLLM: only the module
# paths, names, signatures and attributes a KV connector imports or
# receives, so pdx.vllm.PdxConnector can be loaded and driven unpatched.
#
# vllm/v1/outputs.py: what the workers return; KVConnectorOutput is what
# update_connector_output receives.
from dataclasses import dataclass, field
from typing import Optional


@dataclass
class KVConnectorOutput:
    finished_sending: "Optional[set[str]]" = None
    finished_recving: "Optional[set[str]]" = None
    kv_connector_stats: "Optional[object]" = None
    kv_cache_events: "Optional[object]" = None
    kv_connector_worker_meta: "Optional[object]" = None
    invalid_block_ids: "set[int]" = field(default_factory=set)
    expected_finished_count: int = 0

    def is_empty(self) -> bool:
        return (not self.finished_sending and not self.finished_recving
                and not self.kv_connector_stats and not self.kv_cache_events
                and not self.invalid_block_ids
                and not self.kv_connector_worker_meta)


@dataclass
class ModelRunnerOutput:
    req_ids: "list[str]"
    # req_id -> the token sampled this step; absent for a partial prefill
    sampled_token_ids: "dict[str, list[int]]"
    kv_connector_output: Optional[KVConnectorOutput] = None
