# Stand-in for vLLM, written from vLLM's source at commit 52a31cc
# (vllm-project/vllm 52a31ccecca203effd490a5b496dc5f8d9496654) for the pdx
# test harness (tests/python/mini_vllm.py). NOT vLLM: only the module
# paths, names, signatures and attributes a KV connector imports or
# receives, so pdx.vllm.PdxConnector can be loaded and driven unpatched.
#
# vllm/forward_context.py (129-178): what start_load_kv receives.
# attn_metadata is a dict layer name -> that layer's metadata, or None in
# a step with no forward pass; no_compile_layers maps a layer name to its
# attention layer, whose kv_cache is the registered tensor.
from dataclasses import dataclass, field
from typing import Any, Optional

_forward_context: "Optional[ForwardContext]" = None


@dataclass
class ForwardContext:
    no_compile_layers: "dict[str, Any]"
    attn_metadata: "Optional[dict[str, Any]]"
    virtual_engine: int = 0
    slot_mapping: "dict[str, Any]" = field(default_factory=dict)


def get_forward_context() -> ForwardContext:
    assert _forward_context is not None, (
        "Forward context is not set. Please use set_forward_context to "
        "set the forward context.")
    return _forward_context


def _set(ctx: "Optional[ForwardContext]") -> None:
    """Harness only: vLLM's set_forward_context() is a context manager
    over the model; mini_vllm sets and resets the global itself."""
    global _forward_context
    _forward_context = ctx
