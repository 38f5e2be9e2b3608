# Stand-in for vLLM, written from vLLM's source at commit 52a31cc
# (vllm-project/vllm 52a31ccecca203effd490a5b496dc5f8d9496654) for the pdx
# test harness (tests/python/mini_vllm.py). NOT vLLM: only the module
# paths, names, signatures and attributes a KV connector imports or
# receives, so pdx.vllm.PdxConnector can be loaded and driven unpatched.
#
# vllm/config/kv_transfer.py (22-122): the --kv-transfer-config object.
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class KVTransferConfig:
    kv_connector: Optional[str] = None
    engine_id: Optional[str] = None
    kv_buffer_device: Optional[str] = "cuda"
    kv_buffer_size: float = 1e9
    kv_role: Optional[str] = None  # kv_producer | kv_consumer | kv_both
    kv_rank: Optional[int] = None
    kv_parallel_size: int = 1
    kv_ip: str = "127.0.0.1"
    kv_port: int = 14579
    kv_connector_extra_config: "dict[str, Any]" = field(default_factory=dict)
    kv_connector_module_path: Optional[str] = None
    enable_permute_local_kv: bool = False
    kv_load_failure_policy: str = "fail"  # "recompute" | "fail"

    def __post_init__(self) -> None:
        if self.engine_id is None:
            self.engine_id = str(uuid.uuid4())
        if self.kv_role is not None and self.kv_role not in (
                "kv_producer", "kv_consumer", "kv_both"):
            raise ValueError("Unsupported kv_role: %s. Supported roles are "
                             "kv_producer, kv_consumer, kv_both"
                             % self.kv_role)
        if self.kv_connector is not None and self.kv_role is None:
            raise ValueError("Please specify kv_role when kv_connector is "
                             "set, supported roles are kv_producer, "
                             "kv_consumer, kv_both")
        if self.kv_load_failure_policy not in ("recompute", "fail"):
            raise ValueError("kv_load_failure_policy: recompute or fail")

    @property
    def is_kv_transfer_instance(self) -> bool:
        return self.kv_connector is not None and             self.kv_role in ("kv_producer", "kv_consumer", "kv_both")

    @property
    def is_kv_producer(self) -> bool:
        return self.kv_connector is not None and             self.kv_role in ("kv_producer", "kv_both")

    @property
    def is_kv_consumer(self) -> bool:
        return self.kv_connector is not None and             self.kv_role in ("kv_consumer", "kv_both")

    def get_from_extra_config(self, key: str, default: Any) -> Any:
        return self.kv_connector_extra_config.get(key, default)
