# Stand-in for vLLM, written from vLLM's source at commit 52a31cc
# (vllm-project/vllm 52a31ccecca203effd490a5b496dc5f8d9496654) for the pdx
# test harness (tests/python/mini_vllm.py). NOT vLLM: only the module
# paths, names, signatures and attributes a KV connector imports or
# receives, so pdx.vllm.PdxConnector can be loaded and driven unpatched.
