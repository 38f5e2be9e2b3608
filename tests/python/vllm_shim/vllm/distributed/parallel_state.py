# Stand-in for vLLM, written from vLLM's source at commit 52a31cc
# (vllm-project/vllm 52a31ccecca203effd490a5b496dc5f8d9496654) for the pdx
# test harness (tests/python/mini_vllm.py). NOT vLLM: only the module
# paths, names, signatures and attributes a KV connector imports or
# receives, so pdx.vllm.PdxConnector can be loaded and driven unpatched.
# vllm/distributed/parallel_state.py: the calling worker's tensor-parallel
# rank and group size. vLLM reads them from its process groups; the harness
# runs one worker per process group and sets them with _set_tp().
_tp_rank = 0
_tp_size = 1


def _set_tp(rank: int, size: int) -> None:
    """Harness only (not in vLLM): the rank the next calls report."""
    global _tp_rank, _tp_size
    _tp_rank, _tp_size = rank, size


def get_tensor_model_parallel_rank() -> int:
    return _tp_rank


def get_tensor_model_parallel_world_size() -> int:
    return _tp_size
