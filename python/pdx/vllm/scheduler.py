"""PdxConnector's scheduler side: which requests send or receive, their
blocks, when a send is announced, and the answer a prefill returns.

A send is announced in the step that schedules the prompt's last prefill
chunk (all its blocks are known then; every layer of that pass is pushed
as soon as it is computed). A request preempted after that (async
scheduling can pick it while that step is in flight) has its blocks
freed while the agent may still read them: the worker aborts the send
before the next forward (handle_preemptions). vLLM at 52a31cc stops the
request with that step's token: it finishes without kv_transfer_params
(the decode side prefills, or, told up front, fails its load and
recomputes). vLLM after PR 50297 drops that token and computes the
request again (requires_kv_delivery): its send goes again under a new
xfer_id (_rearm). A receive is vLLM's asynchronous load: the request waits
(WAITING_FOR_REMOTE_KVS) until the worker reports it.
"""
import logging
import math
from dataclasses import dataclass, field
from typing import Dict, List, Set

from . import params
from .meta import PdxMetadata, RecvMeta, SendMeta, XferMeta

log = logging.getLogger("pdx.vllm")

_FINISHED_OK = ("FINISHED_LENGTH_CAPPED", "FINISHED_STOPPED")


@dataclass
class _Send:
    send: params.Send
    prompt_tokens: int
    blocks: List[int] = field(default_factory=list)
    announced: bool = False
    preempted: bool = False  # after announced: the send is aborted


def _safe(read, p, req_id):
    try:
        return read(p)
    except ValueError as e:
        log.warning("request %s: %s; it runs here without a transfer",
                    req_id, e)
        return None


class PdxScheduler:
    def __init__(self, vllm_config):
        self.block_size = vllm_config.cache_config.block_size
        self.agents: List[str] = []      # rank r's agent peer address
        self._sends: Dict[str, _Send] = {}
        self._recvs: Dict[str, params.Recv] = {}
        self._meta = PdxMetadata()
        # prefill requests whose xfer_id a live send has: they run here
        # without a transfer (the id would have named the other's KV)
        self._dup_ids: Set[str] = set()
        # sends announced and not reported finished (finished_sending):
        # xfer_id -> request id; a request that finished is out of
        # _sends while its send waits for the decode side
        self._in_flight: Dict[str, str] = {}

    def _live(self, xfer: str) -> bool:
        return xfer in self._in_flight or \
            any(st.send.xfer == xfer for st in self._sends.values())

    def set_agents(self, handshakes) -> None:
        self.agents = [handshakes[r].peer_addr for r in sorted(handshakes)]

    # -- decode side ---------------------------------------------------
    def on_new_request(self, request) -> None:
        r = _safe(params.read_recv, request.kv_transfer_params,
                  request.request_id)
        if r is not None:  # the sender keeps its KV while we queue
            self._meta.holds.append(XferMeta(request.request_id, r.xfer,
                                             r.peers))

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        r = _safe(params.read_recv, request.kv_transfer_params,
                  request.request_id)
        if r is None:
            return 0, False
        n = len(request.prompt_token_ids) - num_computed_tokens
        return (n, True) if n > 0 else (0, False)

    def update_state_after_alloc(self, request, blocks,
                                 num_external_tokens) -> None:
        p, rid = request.kv_transfer_params, request.request_id
        if num_external_tokens > 0:
            r = _safe(params.read_recv, p, rid)
            if r is not None:
                ids = list(blocks.get_block_ids()[0])
                held = len(ids) - len(blocks.get_unhashed_block_ids())
                n = math.ceil(len(request.prompt_token_ids) / self.block_size)
                self._meta.recvs.append(RecvMeta(
                    rid, r.xfer, r.peers, ids[:n], held * self.block_size,
                    len(request.prompt_token_ids)))
                self._recvs[rid] = r
                p["do_remote_prefill"] = False  # taken: asked for once
            return
        s = _safe(params.read_send, p, rid)
        if s is None or rid in self._sends or rid in self._dup_ids:
            return
        if self._live(s.xfer):
            log.warning("request %s: xfer_id %s is another request's, in "
                        "flight; it runs here without a transfer", rid,
                        s.xfer)
            self._dup_ids.add(rid)
            return
        self._sends[rid] = _Send(s, len(request.prompt_token_ids))

    # -- prefill side --------------------------------------------------
    def _announce_if_complete(self, rid: str, st: _Send, computed: int):
        if st.announced or computed < st.prompt_tokens:
            return
        n = math.ceil(st.prompt_tokens / self.block_size)
        self._meta.sends.append(SendMeta(rid, st.send.xfer, st.send.peers,
                                         st.blocks[:n], st.prompt_tokens))
        st.announced = True
        self._in_flight[st.send.xfer] = rid

    def _rearm(self, rid: str, st: _Send) -> None:
        """A send aborted by a preemption, its request scheduled again:
        vLLM after PR 50297 (requires_kv_delivery) recomputes such a
        request rather than finishing it with that step's token. When no
        decode side was named up front nobody waits on the aborted id,
        so it sends again under a new one (the agents refuse an id that
        ended), announced as before; the answer names the new id. A
        decode side named up front heard `failed` already and is on its
        own way (it recomputes, or fails): the request answers no
        kv_transfer_params, as before."""
        if st.send.peers:
            return
        self._in_flight.pop(st.send.xfer, None)
        old, st.send.xfer = st.send.xfer, params.fresh_xfer()
        st.preempted = st.announced = False
        st.blocks = []
        log.info("request %s: computed again after its preemption: its "
                 "send goes again as %s (was %s)", rid, st.send.xfer, old)

    def build_connector_meta(self, so) -> PdxMetadata:
        for rid in getattr(so, "preempted_req_ids", None) or ():
            st = self._sends.get(rid)
            if st is not None and st.announced and not st.preempted:
                st.preempted = True
                self._meta.preempted.append(XferMeta(rid, st.send.xfer))
        for new in so.scheduled_new_reqs:
            st = self._sends.get(new.req_id)
            if st is not None:
                if st.preempted:
                    self._rearm(new.req_id, st)
                st.blocks = list(new.block_ids[0])
                self._announce_if_complete(
                    new.req_id, st, new.num_computed_tokens +
                    so.num_scheduled_tokens.get(new.req_id, 0))
        cached = so.scheduled_cached_reqs
        resumed = set(getattr(cached, "resumed_req_ids", ()) or ())
        for i, rid in enumerate(cached.req_ids):
            st = self._sends.get(rid)
            if st is not None and st.preempted and rid in resumed:
                self._rearm(rid, st)
            if st is None or st.announced:
                continue
            got = cached.new_block_ids[i]
            if got is not None:
                st.blocks = (list(got[0]) if rid in resumed
                             else st.blocks + list(got[0]))
            self._announce_if_complete(
                rid, st, cached.num_computed_tokens[i] +
                so.num_scheduled_tokens.get(rid, 0))
        meta, self._meta = self._meta, PdxMetadata()
        return meta

    def update_connector_output(self, output) -> None:
        for rid in getattr(output, "finished_recving", None) or ():
            self._recvs.pop(rid, None)
        done = set(getattr(output, "finished_sending", None) or ())
        if done:
            self._in_flight = {x: r for x, r in self._in_flight.items()
                               if r not in done}

    def request_finished(self, request, block_ids):
        rid, p = request.request_id, request.kv_transfer_params
        if rid in self._dup_ids:
            self._dup_ids.discard(rid)
            return False, None
        st = self._sends.pop(rid, None)
        if st is None and isinstance(p, dict) and p.get("xfer_id"):
            s = _safe(params.read_send, p, rid)  # left before scheduled
            # (its abort must not end a live send of the same id)
            st = _Send(s, 0) if s is not None and not self._live(s.xfer) \
                else None
        if st is not None:
            if st.preempted:
                self._in_flight.pop(st.send.xfer, None)  # aborted
                log.info("request %s: preempted after its send was "
                         "announced: the send was aborted, no "
                         "kv_transfer_params", rid)
                return False, None
            if not st.announced:
                # never announced: a decode side named up front may wait
                if st.send.peers:
                    self._meta.aborts.append(XferMeta(rid, st.send.xfer,
                                                      st.send.peers))
                return False, None
            if request.status.name not in _FINISHED_OK:
                self._meta.aborts.append(XferMeta(rid, st.send.xfer))
                return True, None  # freed when the agent says failed
            if not self.agents:
                log.error("request %s: no agent known (no handshake "
                          "metadata from the workers)", rid)
                self._meta.aborts.append(XferMeta(rid, st.send.xfer))
                return True, None
            out = request.output_token_ids
            return True, params.answer(st.send, self.agents,
                                       out[0] if len(out) else None)
        if rid in self._recvs:  # loading: aborted (a load done is gone)
            r = self._recvs.pop(rid)
            self._meta.aborts.append(XferMeta(rid, r.xfer))
            return False, None
        r = _safe(params.read_recv, p, rid)
        if r is not None:  # left before its load was asked for
            self._meta.aborts.append(XferMeta(rid, r.xfer, r.peers))
            p["do_remote_prefill"] = False
        return False, None
