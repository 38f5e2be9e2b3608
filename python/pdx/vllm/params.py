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
    remote_agents      optional, one per tensor-parallel rank (rank order);
                       their count is the other side's TP size
    remote_tp_size     the same count (what pdx-engine also reads)
    first_token        decode side, optional: the prefill's first token

Other keys (vLLM's remote_engine_id, remote_block_ids, ...) are ignored.
"""
import re
from dataclasses import dataclass
from typing import List, Optional

import pdx

_HEX32 = re.compile(r"^[0-9a-fA-F]{32}$")


@dataclass
class Send:
    xfer: str              # hex, minted here when the request had none
    peers: List[str]       # the decode side's agents, rank order; []: the
                           # first agent that claims the transfer gets it


@dataclass
class Recv:
    xfer: str
    peers: List[str]       # rank r's prefill agent: peers[r], else peers[0]


def _str(p, key):
    v = p.get(key)
    return v if isinstance(v, str) and v else None


def _agents(p) -> List[str]:
    """remote_agents, else [remote_agent], else []."""
    peers = p.get("remote_agents")
    if isinstance(peers, list) and peers and \
            all(isinstance(a, str) for a in peers):
        return list(peers)
    one = _str(p, "remote_agent")
    return [one] if one else []


def _asks(p, key: str) -> bool:
    """p[key] is true; ValueError when it is there and no bool (a
    client's "true", a string, was taken for false without a word)."""
    if not isinstance(p, dict):
        return False
    v = p.get(key)
    if v is not None and not isinstance(v, bool):
        raise ValueError("kv_transfer_params.%s: want true or false, not %r"
                         % (key, v))
    return v is True


def read_send(p) -> Optional[Send]:
    """The prefill side's part, or None when the request sends nothing.
    ValueError when the object asks to send but is malformed."""
    if not _asks(p, "do_remote_decode"):
        return None
    x = _str(p, "xfer_id")
    if x is not None and not _HEX32.match(x):
        raise ValueError("kv_transfer_params.xfer_id: want 32 hex digits")
    peers = _agents(p)
    if not all(a.startswith("tcp://") for a in peers):
        raise ValueError("kv_transfer_params.remote_agent: want tcp://HOST:PORT")
    return Send(x.lower() if x else fresh_xfer(), peers)


def fresh_xfer() -> str:
    """A new xfer_id, for a send whose request named none, or whose
    first send was aborted (an agent refuses an id that ended)."""
    return pdx.XferId().hex


def read_recv(p) -> Optional[Recv]:
    """The decode side's part, or None when the request receives nothing
    (or PdxConnector took it already: do_remote_prefill is set false
    then, as vLLM's connectors do). ValueError when malformed."""
    if not _asks(p, "do_remote_prefill"):
        return None
    x = _str(p, "xfer_id")
    if x is None or not _HEX32.match(x):
        raise ValueError("kv_transfer_params.xfer_id: want 32 hex digits")
    peers = _agents(p)
    if not peers or not all(a.startswith("tcp://") for a in peers):
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
        out["remote_tp_size"] = len(agents)
    if first_token is not None:
        out["first_token"] = first_token
    return out


def xfer(xfer_hex: str) -> pdx.XferId:
    """The transfer, the same id on every tensor-parallel rank, as
    pdx-engine and pdx.sglang name it: each rank has an agent of its own,
    and agents that reshard heads between TP sizes derive their legs' ids
    from it (docs/protocol.md, "TP legs")."""
    return pdx.XferId(bytes.fromhex(xfer_hex))
