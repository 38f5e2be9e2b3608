"""pdx inside SGLang: a disaggregation transfer backend (docs/sglang.md).

SGLang's four roles, by the names its get_kv_class() hands out:
PdxKVManager (one per rank: the agent link and the registered KV pool),
PdxKVSender (prefill, one per request), PdxKVReceiver (decode, one per
request), PdxKVBootstrapServer (one per prefill instance). KVArgs is
SGLang's shape of the arguments. Importing this module imports nothing of
SGLang and starts nothing; install() (hook.py) puts these classes behind
an SGLang backend name.
"""
from .base import KVArgs, KVPoll, KVTransferMetric, PdxTransferError
from .bootstrap import PdxKVBootstrapServer
from .hook import install
from .manager import PdxKVManager
from .receiver import PdxKVReceiver
from .sender import PdxKVSender

__all__ = ["KVArgs", "KVPoll", "KVTransferMetric", "PdxTransferError",
           "PdxKVBootstrapServer", "PdxKVManager", "PdxKVReceiver",
           "PdxKVSender", "install"]
