# Stand-in for vLLM, written from vLLM's source at commit 52a31cc
# (vllm-project/vllm 52a31ccecca203effd490a5b496dc5f8d9496654) for the pdx
# test harness (tests/python/mini_vllm.py). NOT vLLM: only the module
# paths, names, signatures and attributes a KV connector imports or
# receives, so pdx.vllm.PdxConnector can be loaded and driven unpatched.
#
# vllm/v1/core/sched/output.py (181-241): what one schedule() hands the
# workers. Fields a connector reads are kept with vLLM's names; sampling
# and multimodal fields are left out.
from dataclasses import dataclass, field
from typing import Optional


@dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: "list[int]"
    block_ids: "tuple[list[int], ...]"
    num_computed_tokens: int
    max_tokens: int = 16  # vLLM: inside sampling_params


@dataclass
class CachedRequestData:
    req_ids: "list[str]" = field(default_factory=list)
    # ids whose blocks and tokens are given again after a preemption
    resumed_req_ids: "set[str]" = field(default_factory=set)
    new_token_ids: "list[list[int]]" = field(default_factory=list)
    # resumed requests: every token id so far
    all_token_ids: "dict[str, list[int]]" = field(default_factory=dict)
    new_block_ids: "list[Optional[tuple[list[int], ...]]]" =         field(default_factory=list)
    num_computed_tokens: "list[int]" = field(default_factory=list)
    num_output_tokens: "list[int]" = field(default_factory=list)

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)

    @classmethod
    def make_empty(cls) -> "CachedRequestData":
        return cls()


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: "list[NewRequestData]"
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: "dict[str, int]"
    total_num_scheduled_tokens: int
    scheduled_spec_decode_tokens: "dict[str, list[int]]"
    scheduled_encoder_inputs: "dict[str, list[int]]"
    num_common_prefix_blocks: "list[int]"
    finished_req_ids: "set[str]"
    free_encoder_mm_hashes: "list[str]"
    preempted_req_ids: "Optional[set[str]]" = None
    kv_connector_metadata: "Optional[object]" = None
