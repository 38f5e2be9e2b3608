# Stand-in for vLLM, written from vLLM's source at commit 52a31cc
# (vllm-project/vllm 52a31ccecca203effd490a5b496dc5f8d9496654) for the pdx
# test harness (tests/python/mini_vllm.py). NOT vLLM: only the module
# paths, names, signatures and attributes a KV connector imports or
# receives, so pdx.vllm.PdxConnector can be loaded and driven unpatched.
#
# vllm/v1/kv_cache_interface.py: KVCacheConfig, the third constructor
# argument. One group (no HMA); kv_cache_tensors lists the per-layer
# allocations.
from dataclasses import dataclass, field


@dataclass
class KVCacheTensor:
    size: int  # bytes
    shared_by: "list[str]"


@dataclass
class KVCacheGroupSpec:
    layer_names: "list[str]"
    kv_cache_spec: object = None


@dataclass
class KVCacheConfig:
    num_blocks: int
    kv_cache_tensors: "list[KVCacheTensor]" = field(default_factory=list)
    kv_cache_groups: "list[KVCacheGroupSpec]" = field(default_factory=list)
