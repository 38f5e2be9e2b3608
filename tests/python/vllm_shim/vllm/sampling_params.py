# Stand-in for vLLM, written from vLLM's source at commit 52a31cc
# (vllm-project/vllm 52a31ccecca203effd490a5b496dc5f8d9496654) for the pdx
# test harness (tests/python/mini_vllm.py). NOT vLLM: only the module
# paths, names, signatures and attributes a KV connector imports or
# receives, so pdx.vllm.PdxConnector can be loaded and driven unpatched.
#
# vllm/sampling_params.py: only max_tokens and extra_args (where the
# OpenAI server puts kv_transfer_params, completion/protocol.py:312-314).
from typing import Any, Optional


class SamplingParams:
    def __init__(self, max_tokens: int = 16,
                 extra_args: Optional[dict[str, Any]] = None):
        self.max_tokens = max_tokens
        self.extra_args = extra_args
