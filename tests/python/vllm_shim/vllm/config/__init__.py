# Stand-in for vLLM, written from vLLM's source at commit 52a31cc
# (vllm-project/vllm 52a31ccecca203effd490a5b496dc5f8d9496654) for the pdx
# test harness (tests/python/mini_vllm.py). NOT vLLM: only the module
# paths, names, signatures and attributes a KV connector imports or
# receives, so pdx.vllm.PdxConnector can be loaded and driven unpatched.
#
# vllm/config/: the parts of VllmConfig a connector reads. vLLM's configs
# have many more fields; these keep vLLM's names.
from dataclasses import dataclass, field
from typing import Optional

from vllm.config.kv_transfer import KVTransferConfig


@dataclass
class ModelConfig:
    model: str = "tiny"
    served_model_name: Optional[str] = None
    dtype: str = "bfloat16"
    max_model_len: int = 8192
    use_mla: bool = False


@dataclass
class CacheConfig:
    block_size: int = 16
    cache_dtype: str = "auto"
    enable_prefix_caching: bool = True
    num_gpu_blocks: Optional[int] = None


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    data_parallel_rank: int = 0

    @property
    def world_size(self) -> int:
        return self.pipeline_parallel_size * self.tensor_parallel_size


@dataclass
class SchedulerConfig:
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    async_scheduling: bool = False


@dataclass
class VllmConfig:
    model_config: ModelConfig = field(default_factory=ModelConfig)
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)
    kv_transfer_config: Optional[KVTransferConfig] = None


__all__ = ["CacheConfig", "KVTransferConfig", "ModelConfig",
           "ParallelConfig", "SchedulerConfig", "VllmConfig"]
