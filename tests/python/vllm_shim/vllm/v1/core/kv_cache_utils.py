# Stand-in for vLLM, written from vLLM's source at commit 52a31cc
# (vllm-project/vllm 52a31ccecca203effd490a5b496dc5f8d9496654) for the pdx
# test harness (tests/python/mini_vllm.py). NOT vLLM: only the module
# paths, names, signatures and attributes a KV connector imports or
# receives, so pdx.vllm.PdxConnector can be loaded and driven unpatched.
#
# vllm/v1/core/kv_cache_utils.py: one KV cache block of the block pool.
from dataclasses import dataclass
from typing import Any, Optional


@dataclass(eq=False)
class KVCacheBlock:
    block_id: int
    ref_cnt: int = 0
    # set once the block is full and cached (prefix caching)
    _block_hash: Optional[Any] = None
    is_null: bool = False

    @property
    def block_hash(self) -> Optional[Any]:
        return self._block_hash

    @block_hash.setter
    def block_hash(self, h: Any) -> None:
        assert self._block_hash is None, "the block already has a hash"
        self._block_hash = h

    def reset_hash(self) -> None:
        self._block_hash = None
