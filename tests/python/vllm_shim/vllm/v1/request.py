# Stand-in for vLLM, written from vLLM's source at commit 52a31cc
# (vllm-project/vllm 52a31ccecca203effd490a5b496dc5f8d9496654) for the pdx
# test harness (tests/python/mini_vllm.py). NOT vLLM: only the module
# paths, names, signatures and attributes a KV connector imports or
# receives, so pdx.vllm.PdxConnector can be loaded and driven unpatched.
#
# vllm/v1/request.py: Request and RequestStatus, the fields connectors
# read (notes 7.1). The constructor is reduced to what the harness
# passes; vLLM's also takes pooling params, eos id, priority, etc.
import enum
from typing import Any, Callable, Optional


class FinishReason(enum.IntEnum):  # vllm/v1/engine/__init__.py
    STOP = 0
    LENGTH = 1
    ABORT = 2
    ERROR = 3

    def __str__(self):
        return ("stop", "length", "abort", "error")[self.value]


class RequestStatus(enum.IntEnum):
    WAITING = enum.auto()
    WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR = enum.auto()
    WAITING_FOR_REMOTE_KVS = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    # Note: anything after PREEMPTED is a finished status.
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_IGNORED = enum.auto()
    FINISHED_ERROR = enum.auto()

    def __str__(self):
        return self.name

    @staticmethod
    def is_finished(status: "RequestStatus") -> bool:
        return status > RequestStatus.PREEMPTED

    @staticmethod
    def get_finished_reason(status: "RequestStatus"
                            ) -> Optional[FinishReason]:
        return _FINISHED_REASON_MAP.get(status)


_FINISHED_REASON_MAP = {
    RequestStatus.FINISHED_STOPPED: FinishReason.STOP,
    RequestStatus.FINISHED_LENGTH_CAPPED: FinishReason.LENGTH,
    RequestStatus.FINISHED_ABORTED: FinishReason.ABORT,
    RequestStatus.FINISHED_IGNORED: FinishReason.LENGTH,
    RequestStatus.FINISHED_ERROR: FinishReason.ERROR,
}


class Request:
    def __init__(self, request_id: str, prompt_token_ids: "list[int]",
                 sampling_params: "SamplingParams",
                 arrival_time: float = 0.0,
                 block_hasher: Optional[Callable[["Request"], list]] = None):
        self.request_id = request_id
        self.sampling_params = sampling_params
        self.arrival_time = arrival_time
        self.status = RequestStatus.WAITING
        self.max_tokens = sampling_params.max_tokens
        self.stop_reason = None
        # request.py:114-117
        self.kv_transfer_params: Optional[dict[str, Any]] = None
        if sampling_params.extra_args is not None:
            self.kv_transfer_params = sampling_params.extra_args.get(
                "kv_transfer_params")
        self.prompt_token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(self.prompt_token_ids)
        self._output_token_ids: "list[int]" = []
        self._all_token_ids: "list[int]" = list(self.prompt_token_ids)
        self.num_computed_tokens = 0
        self.num_preemptions = 0
        self.block_hashes: list = []
        self.get_hash_new_full_blocks = None
        if block_hasher is not None:
            self.get_hash_new_full_blocks = lambda: block_hasher(self)
            self.block_hashes = self.get_hash_new_full_blocks()

    @property
    def output_token_ids(self) -> "list[int]":
        return list(self._output_token_ids)

    @property
    def all_token_ids(self) -> "list[int]":
        return list(self._all_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self._all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self._output_token_ids)

    def append_output_token_ids(self, token_ids) -> None:
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        self._output_token_ids.extend(token_ids)
        self._all_token_ids.extend(token_ids)
        if self.get_hash_new_full_blocks is not None:
            self.block_hashes.extend(self.get_hash_new_full_blocks())

    def is_finished(self) -> bool:
        return RequestStatus.is_finished(self.status)

    def get_finished_reason(self) -> Optional[FinishReason]:
        return RequestStatus.get_finished_reason(self.status)
