"""pdx inside vLLM: PdxConnector, a V1 KV connector (connector.py).

vLLM imports this module in every process and then takes PdxConnector
from it; importing it starts nothing. PdxConnector is resolved on first
use, so the rest (layout.py, params.py) imports without vLLM too."""

__all__ = ["PdxConnector"]


def __getattr__(name):
    if name == "PdxConnector":
        from .connector import PdxConnector
        return PdxConnector
    raise AttributeError("module 'pdx.vllm' has no attribute %r" % name)
