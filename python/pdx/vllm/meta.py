"""What the scheduler side tells the worker side each step (vLLM pickles
it across processes: plain data only)."""
from dataclasses import dataclass, field
from typing import List, Optional

try:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (
        KVConnectorMetadata)
except ImportError:  # KVConnectorHandshakeMetadata and this are markers
    KVConnectorMetadata = object
try:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (
        KVConnectorHandshakeMetadata)
except ImportError:
    KVConnectorHandshakeMetadata = object


@dataclass
class SendMeta:
    """Announce a send: the prompt's blocks, in token order; layer done
    for it in this step's forward pass (its last prefill chunk). peers:
    the decode side's agents, rank order, when the request named them
    (empty: an open send, claimed by the first agent that asks).
    tokens: the prompt's (its last block's share, in the caches' kernel
    blocks)."""
    req_id: str
    xfer: str
    peers: List[str]
    blocks: List[int]
    tokens: int = 0


@dataclass
class RecvMeta:
    """Announce a receive into blocks; the first skip_tokens are held
    here already (a local prefix hit). tokens: the prompt's."""
    req_id: str
    xfer: str
    peers: List[str]
    blocks: List[int]
    skip_tokens: int
    tokens: int = 0


@dataclass
class XferMeta:
    """A hold (keep the sender's lease while we queue), or an abort: of a
    transfer announced here (peers None), or of one never announced here
    (the agent at peers tells the other side to free its blocks)."""
    req_id: str
    xfer: str
    peers: Optional[List[str]] = None


@dataclass
class PdxMetadata(KVConnectorMetadata):
    sends: List[SendMeta] = field(default_factory=list)
    recvs: List[RecvMeta] = field(default_factory=list)
    holds: List[XferMeta] = field(default_factory=list)
    aborts: List[XferMeta] = field(default_factory=list)
    # sends announced whose request was preempted in this step: its
    # blocks are free again and this step's forward may write them
    preempted: List[XferMeta] = field(default_factory=list)


@dataclass
class PdxHandshake(KVConnectorHandshakeMetadata):
    """A worker's agent, as EngineCore hands it to the scheduler side:
    its peer address, and its engine address (what pdx-engine's
    /v1/pdx/info calls "agent")."""
    rank: int
    peer_addr: str
    agent: Optional[str] = None
