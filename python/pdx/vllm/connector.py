"""pdx.vllm.PdxConnector: pdx as a vLLM V1 KV connector, loaded without
patching vLLM:

    --kv-transfer-config '{"kv_connector": "PdxConnector",
        "kv_connector_module_path": "pdx.vllm", "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute"}'

Written against vLLM's KVConnectorBase_V1 at commit 52a31cc (2026-05-27;
docs/vllm.md): the scheduler side (scheduler.py) and the worker side
(worker.py) are separate objects in separate processes, as vLLM makes
one instance per role.
"""
import logging

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1, KVConnectorRole)

from .meta import PdxMetadata
from .scheduler import PdxScheduler
from .worker import PdxWorker

log = logging.getLogger("pdx.vllm")


class PdxConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        self._sched = self._worker = None
        if role == KVConnectorRole.SCHEDULER:
            self._sched = PdxScheduler(vllm_config)
        else:
            self._worker = PdxWorker(vllm_config)

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config):
        """HND for a model of KV heads, nothing for MLA's latent, as
        NixlConnector answers. vLLM asks the class before any cache
        exists (get_kv_cache_layout; the attention backend's own
        requirement and VLLM_KV_CACHE_LAYOUT come first): asking nothing,
        an instance on FlashInfer (HND on Blackwell) and one on
        FlashAttention (NHD) held different orders, which the agents
        convert but at a row per head and token. HND also keeps each
        head's tokens together, so instances of different TP sizes move
        a block's heads in one piece rather than a piece a token."""
        model = getattr(vllm_config, "model_config", None)
        if model is None:  # asked before vLLM knows the model
            log.warning("pdx: no model config to choose the KV cache "
                        "layout by; vLLM's default then")
            return None
        return None if model.use_mla else "HND"

    @property
    def requires_kv_delivery(self) -> bool:
        """vLLM after PR 50297 asks (its default says the same for a
        producer): a prefill preempted while its last step ran is then
        computed again instead of finished without its KV, and its send
        goes again (scheduler.py, _rearm)."""
        return self._kv_transfer_config.is_kv_producer

    # -- scheduler side ----------------------------------------------------
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        return self._sched.get_num_new_matched_tokens(request,
                                                      num_computed_tokens)

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        self._sched.update_state_after_alloc(request, blocks,
                                             num_external_tokens)

    def build_connector_meta(self, scheduler_output) -> PdxMetadata:
        return self._sched.build_connector_meta(scheduler_output)

    def on_new_request(self, request) -> None:
        self._sched.on_new_request(request)

    def update_connector_output(self, connector_output) -> None:
        self._sched.update_connector_output(connector_output)

    def request_finished(self, request, block_ids):
        return self._sched.request_finished(request, block_ids)

    def set_xfer_handshake_metadata(self, metadata) -> None:
        self._sched.set_agents(metadata)

    # -- worker side -------------------------------------------------------
    def register_kv_caches(self, kv_caches) -> None:
        self._worker.register_kv_caches(kv_caches)

    def get_handshake_metadata(self):
        return self._worker.handshake()

    def handle_preemptions(self, kv_connector_metadata) -> None:
        """The step's metadata; an older vLLM (before 0.20) passes the
        preempted requests' ids instead (a set, which the worker failed
        on, ending vLLM's EngineCore): bind_connector_metadata then deals
        with them."""
        if isinstance(kv_connector_metadata, PdxMetadata):
            self._worker.preempted(kv_connector_metadata)

    def bind_connector_metadata(self, connector_metadata) -> None:
        """Before the forward, in every vLLM: the step's preempted sends
        are ended (again a no-op where handle_preemptions did it), and its
        transfers announced here, so save_kv_layer pushes each layer as
        it is computed. vLLM after PR 53333 calls start_load_kv after the
        forward when no load of the step is synchronous (none of ours
        is): announced there, the sends' layers all went at its end."""
        super().bind_connector_metadata(connector_metadata)
        self._worker.preempted(connector_metadata)
        self._worker.start(connector_metadata)

    def start_load_kv(self, forward_context, **kwargs) -> None:
        """Done at bind_connector_metadata (once a step)."""
        self._worker.start(self._get_connector_metadata())

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Loads are vLLM's asynchronous kind: done before the request is
        scheduled, so a layer never waits here."""

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata,
                      **kwargs) -> None:
        self._worker.layer_saved(layer_name)

    def wait_for_save(self) -> None:
        self._worker.step_saved()

    def get_finished(self, finished_req_ids):
        return self._worker.finished(finished_req_ids)

    def get_block_ids_with_load_errors(self):
        return self._worker.load_errors()

    @property
    def stats(self):
        """Worker side: the transfers that ended here (a Counter: sent,
        received, failed, bytes_sent, bytes_received); None on the
        scheduler side."""
        return self._worker.stats if self._worker is not None else None

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.close()
