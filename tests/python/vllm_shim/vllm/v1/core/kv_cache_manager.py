# Stand-in for vLLM, written from vLLM's source at commit 52a31cc
# (vllm-project/vllm 52a31ccecca203effd490a5b496dc5f8d9496654) for the pdx
# test harness (tests/python/mini_vllm.py). NOT vLLM: only the module
# paths, names, signatures and attributes a KV connector imports or
# receives, so pdx.vllm.PdxConnector can be loaded and driven unpatched.
#
# vllm/v1/core/kv_cache_manager.py: KVCacheBlocks, what
# update_state_after_alloc receives (kv_cache_manager.py:58-101). The
# manager itself is the harness's (tests/python/mini_vllm.py).
from dataclasses import dataclass
from typing import Sequence

from vllm.v1.core.kv_cache_utils import KVCacheBlock


@dataclass
class KVCacheBlocks:
    # blocks[i][j]: the j-th block of the i-th KV cache group
    blocks: "tuple[Sequence[KVCacheBlock], ...]"

    def get_block_ids(self) -> "tuple[list[int], ...]":
        return tuple([blk.block_id for blk in group] for group in self.blocks)

    def get_unhashed_block_ids(self) -> "list[int]":
        """Block ids of blocks not yet hashed (single group only)."""
        assert len(self.blocks) == 1, "Only one group is supported"
        return [blk.block_id for blk in self.blocks[0]
                if blk.block_hash is None and not blk.is_null]

    def get_unhashed_block_ids_all_groups(self) -> "list[list[int]]":
        return [[blk.block_id for blk in group
                 if blk.block_hash is None and not blk.is_null]
                for group in self.blocks]
