# Stand-in for vLLM, written from vLLM's source at commit 52a31cc
# (vllm-project/vllm 52a31ccecca203effd490a5b496dc5f8d9496654) for the pdx
# test harness (tests/python/mini_vllm.py). NOT vLLM: only the module
# paths, names, signatures and attributes a KV connector imports or
# receives, so pdx.vllm.PdxConnector can be loaded and driven unpatched.
#
# vllm/distributed/kv_transfer/kv_connector/v1/base.py: the connector
# interface. Line numbers in the comments are base.py's at 52a31cc. The
# type hints vLLM guards with TYPE_CHECKING are strings here too.
import enum
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional

if TYPE_CHECKING:
    import torch

# (71) copies blocks between the device cache and a host buffer:
# (src_tensors, dst_tensors, src_indices, dst_indices, direction)
CopyBlocksOp = Callable[..., None]


class SupportsHMA(ABC):  # (85-114)
    @abstractmethod
    def request_finished_all_groups(self, request: "Request",
                                    block_ids: "tuple[list[int], ...]"
                                    ) -> "tuple[bool, dict[str, Any] | None]":
        raise NotImplementedError


class KVConnectorRole(enum.Enum):  # (124-129)
    SCHEDULER = 0
    WORKER = 1


class KVConnectorHandshakeMetadata(ABC):  # (132)
    """Serialisable metadata a worker hands the scheduler at start."""


class KVConnectorMetadata(ABC):  # (141) scheduler -> worker, pickled
    pass


class KVConnectorWorkerMetadata(ABC):  # (150-168) worker -> scheduler
    @abstractmethod
    def aggregate(self, other: "KVConnectorWorkerMetadata"
                  ) -> "KVConnectorWorkerMetadata":
        raise NotImplementedError


class KVConnectorBase_V1(ABC):
    @property
    def prefer_cross_layer_blocks(self) -> bool:  # (176)
        return False

    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole,
                 kv_cache_config: "KVCacheConfig"):  # (184-201)
        self._connector_metadata: Optional[KVConnectorMetadata] = None
        self._vllm_config = vllm_config
        if vllm_config.kv_transfer_config is not None:
            self._kv_transfer_config = vllm_config.kv_transfer_config
        else:
            raise ValueError("kv_transfer_config must be set for "
                             "KVConnectorBase_V1")
        self._kv_cache_config = kv_cache_config
        self._role = role

    @property
    def role(self) -> KVConnectorRole:  # (203)
        return self._role

    # ==============================
    # Worker-side methods
    # ==============================
    def bind_connector_metadata(
            self, connector_metadata: KVConnectorMetadata) -> None:  # (211)
        self._connector_metadata = connector_metadata

    def clear_connector_metadata(self) -> None:  # (223)
        self._connector_metadata = None

    def _get_connector_metadata(self) -> KVConnectorMetadata:  # (231)
        # Should only be called while set to valid metadata.
        assert self._connector_metadata is not None
        return self._connector_metadata

    def has_connector_metadata(self) -> bool:  # (243)
        return self._connector_metadata is not None

    def register_kv_caches(self, kv_caches: "dict[str, torch.Tensor]"):  # (251)
        return

    def register_cross_layers_kv_cache(self, kv_cache: "torch.Tensor",
                                       attn_backend: type):  # (261)
        return

    def set_host_xfer_buffer_ops(self, copy_operation: CopyBlocksOp):  # (278)
        return

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata
                           ):  # (285)
        return

    @abstractmethod
    def start_load_kv(self, forward_context: "ForwardContext",
                      **kwargs: Any) -> None:  # (292)
        pass

    @abstractmethod
    def wait_for_layer_load(self, layer_name: str) -> None:  # (310)
        pass

    @abstractmethod
    def save_kv_layer(self, layer_name: str, kv_layer: "torch.Tensor",
                      attn_metadata: "AttentionMetadata",
                      **kwargs: Any) -> None:  # (324)
        pass

    @abstractmethod
    def wait_for_save(self):  # (346)
        pass

    def get_finished(self, finished_req_ids: "set[str]"
                     ) -> "tuple[set[str] | None, set[str] | None]":  # (357)
        return None, None

    def get_block_ids_with_load_errors(self) -> "set[int]":  # (375)
        return set()

    def shutdown(self):  # (395)
        return None

    def get_kv_connector_stats(self) -> "KVConnectorStats | None":  # (403)
        return None

    def get_kv_connector_kv_cache_events(self
                                         ) -> "KVConnectorKVEvents | None":  # (409)
        return None

    def get_handshake_metadata(self
                               ) -> "KVConnectorHandshakeMetadata | None":  # (417)
        return None

    def build_connector_worker_meta(self
                                    ) -> "KVConnectorWorkerMetadata | None":  # (429)
        return None

    # ==============================
    # Scheduler-side methods
    # ==============================
    def bind_gpu_block_pool(self, gpu_block_pool: "BlockPool") -> None:  # (443)
        return

    @abstractmethod
    def get_num_new_matched_tokens(self, request: "Request",
                                   num_computed_tokens: int
                                   ) -> "tuple[int | None, bool]":  # (453)
        pass

    @abstractmethod
    def update_state_after_alloc(self, request: "Request",
                                 blocks: "KVCacheBlocks",
                                 num_external_tokens: int):  # (488)
        pass

    @abstractmethod
    def build_connector_meta(self, scheduler_output: "SchedulerOutput"
                             ) -> KVConnectorMetadata:  # (509)
        pass

    def on_new_request(self, request: "Request") -> None:  # (524)
        return

    def update_connector_output(self, connector_output: "KVConnectorOutput"):  # (532)
        return

    def request_finished(self, request: "Request", block_ids: "list[int]"
                         ) -> "tuple[bool, dict[str, Any] | None]":  # (542)
        return False, None

    def take_events(self) -> "Iterable[KVCacheEvent]":  # (563)
        return ()

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: "VllmConfig"
                                    ) -> "str | None":  # (572)
        if cls is KVConnectorBase_V1:
            raise TypeError("get_required_kvcache_layout should not be "
                            "called on the abstract base class")
        return None

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: "dict[str, Any]"
                                         ) -> bool:  # (591)
        return False

    def get_finished_count(self) -> "int | None":  # (613)
        return None

    @classmethod
    def build_kv_connector_stats(cls, data: "dict[str, Any] | None" = None
                                 ) -> "KVConnectorStats | None":  # (625)
        return None

    def set_xfer_handshake_metadata(
            self, metadata: "dict[int, KVConnectorHandshakeMetadata]"
    ) -> None:  # (636)
        return None

    @classmethod
    def build_prom_metrics(cls, *args, **kwargs):  # (647)
        return None

    def reset_cache(self) -> "bool | None":  # (662)
        return None
