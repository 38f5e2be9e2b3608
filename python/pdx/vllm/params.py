"""kv_transfer_params as PdxConnector reads and answers them: the same
object pdx-engine reads (docs/engine.md, "Disaggregated roles"), so one
proxy drives either engine, and vLLM's own proxies, which send the
prefill side `do_remote_decode: true` alone and copy its answer into the
decode request unchanged, drive both.

    do_remote_decode   true: prefill side; the prompt's KV is sent
    do_remote_prefill  true: decode side; the prompt's KV is received
    xfer_id            32 hex digits; the prefill side mints it when absent
    remote_agent       the other side's agent (rank 0); prefill side: when
                       absent, the first agent that claims the transfer
                       gets it (docs/security.md)
    remote_agents      optional, one per tensor-parallel rank
    first_token        decode side, optional: the prefill's first token

Other keys (vLLM's remote_engine_id, remote_block_ids, ...) are ignored.
"""
import hashlib
import re
from dataclasses import dataclass
from typing import List, Optional

import pdx

_HEX32 = re.compile(r"^[0-9a-fA-F]{32}$")


@dataclass
class Send:
    xfer: str              # hex, minted here when the request had none
    peer: Optional[str]    # the decode side's agent, or None: first claim


@dataclass
class Recv:
    xfer: str
    peers: List[str]       # rank r's prefill agent: peers[r], else peers[0]


def _str(p, key):
    v = p.get(key)
    return v if isinstance(v, str) and v else None


def read_send(p) -> Optional[Send]:
    """The prefill side's part, or None when the request sends nothing.
    ValueError when the object asks to send but is malformed."""
    if not isinstance(p, dict) or p.get("do_remote_decode") is not True:
        return None
    x = _str(p, "xfer_id")
    if x is not None and not _HEX32.match(x):
        raise ValueError("kv_transfer_params.xfer_id: want 32 hex digits")
    peer = _str(p, "remote_agent")
    if peer is not None and not peer.startswith("tcp://"):
        raise ValueError("kv_transfer_params.remote_agent: want tcp://HOST:PORT")
    return Send(x.lower() if x else pdx.XferId().hex, peer)


def read_recv(p) -> Optional[Recv]:
    """The decode side's part, or None when the request receives nothing
    (or PdxConnector took it already: do_remote_prefill is set false
    then, as vLLM's connectors do). ValueError when malformed."""
    if not isinstance(p, dict) or p.get("do_remote_prefill") is not True:
        return None
    x = _str(p, "xfer_id")
    if x is None or not _HEX32.match(x):
        raise ValueError("kv_transfer_params.xfer_id: want 32 hex digits")
    peers = p.get("remote_agents")
    if not (isinstance(peers, list) and peers and
            all(isinstance(a, str) for a in peers)):
        peers = [_str(p, "remote_agent")]
    if not all(a and a.startswith("tcp://") for a in peers):
        raise ValueError("kv_transfer_params.remote_agent: want the prefill "
                         "side's agent, tcp://HOST:PORT")
    return Recv(x.lower(), peers)


def answer(send: Send, agents: List[str],
           first_token: Optional[int]) -> dict:
    """The prefill side's answer: what the decode side needs."""
    out = {"do_remote_prefill": True, "do_remote_decode": False,
           "xfer_id": send.xfer, "remote_agent": agents[0]}
    if len(agents) > 1:
        out["remote_agents"] = list(agents)
    if first_token is not None:
        out["first_token"] = first_token
    return out


def rank_xfer(xfer_hex: str, rank: int) -> pdx.XferId:
    """Rank r's own transfer: rank 0 moves the id itself (what a
    pdx-engine peer knows); rank r > 0 a 128-bit id derived from it, the
    same on both sides and unrelated to any other request's."""
    raw = bytes.fromhex(xfer_hex)
    if rank == 0:
        return pdx.XferId(raw)
    return pdx.XferId(hashlib.blake2b(raw + rank.to_bytes(4, "little"),
                                      digest_size=16,
                                      person=b"pdx-tp-rank").digest())
