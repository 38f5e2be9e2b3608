"""PdxKVReceiver: the decode side of one request (one room) on one rank.

SGLang's order (decode.py): built when the request arrives, and polled
from then on; init(prefill_dp_rank) once the prefill instance's sizes are
known; polled until WaitingForInput (or Failed, when the bootstrap server
has not told the prefill ranks PDX_SGLANG_BOOTSTRAP_TIMEOUT_S after the
receiver was built); then send_metadata(page_indices, aux_index, ...) when
pages are allocated; polled until Success or Failed. init asks the
bootstrap server for the prefill rank's agent and layout (a layout unlike
ours fails here, with both in words) or, when the instances' TP sizes
differ, for every prefill rank's; send_metadata is pdx's recv of the
transfer from that agent (those agents: ours takes its heads from the
ranks that hold them) into these pages. A decode-side prefix hit
(decode_prefix_len, whole pages held in the decode rank's radix cache;
the pages named are the rest's) is pdx's skip_tokens: the prefill side
announces every page of the prompt, and its agent sends only those after
the prefix. On "received" the aux row gets
what the prefill side sent beside the KV and the room (aux.py).
"""
import logging
import time
from typing import Optional

import pdx

from .base import KVPoll
from .transfer import Transfer

log = logging.getLogger("pdx.sglang")


class PdxKVReceiver(Transfer):
    def __init__(self, mgr, bootstrap_addr: str,
                 bootstrap_room: Optional[int] = None, **_unused):
        super().__init__(mgr, bootstrap_addr, bootstrap_room)
        self.dp_rank = None
        self.peers = []   # the prefill agents, in rank order
        self.tp_legs = False  # the instances' TP sizes differ
        self.aux_index = None
        # from here, not from init(): decode.py polls a receiver from its
        # creation but calls init() only once the prefill instance's sizes
        # are known, which a server down or frozen never tells
        self.deadline = time.monotonic() + mgr.bootstrap_timeout

    def init(self, prefill_dp_rank: int = 0):
        self.dp_rank = int(prefill_dp_rank or 0)
        self._bootstrap()

    def _bootstrap(self) -> None:
        mgr = self.kv_mgr
        try:
            regs = mgr.prefill_ranks(self.bootstrap_addr, self.dp_rank)
        except LookupError as e:
            return self.fail(str(e))
        if regs is None:
            return
        their_tp = mgr.prefill_info_table[self.bootstrap_addr].attn_tp_size
        for reg in regs:
            why = mgr.layout_differs(reg, their_tp)
            if why:
                return self.fail(why)
        self.peers = [reg["peer_addr"] for reg in regs]
        self.tp_legs = their_tp != mgr.tp_size
        self.state = KVPoll.WaitingForInput
        self._hold()

    def _hold(self) -> None:
        """The request now waits for pages (DecodePreallocQueue), maybe
        longer than the prefill agents' --lease-ms under memory pressure:
        our agent keeps the sender's lease on the KV alive until the
        recv (send_metadata) or an abort, at most --xfer-timeout-ms. A
        held transfer that fails meanwhile (a prefill agent found dead,
        that bound) ends in its event: poll() says Failed then, and
        SGLang drops the request from the queue, instead of learning it
        only at send_metadata once pages were found."""
        held = False
        for peer in self.peers:
            try:
                self.kv_mgr.eng.hold(self.xid, peer)
                held = True
            except pdx.Error as e:
                log.info("pdx.sglang: hold of room %d at %s: %s",
                         self.bootstrap_room, peer, e)
        if held:
            self.kv_mgr.track(self.xid, self)

    def poll(self) -> int:
        if self.state == KVPoll.Bootstrapping:
            if self.dp_rank is not None:
                self._bootstrap()
            if self.state == KVPoll.Bootstrapping and \
                    time.monotonic() > self.deadline:
                self._late()
        return super().poll()

    def _late(self) -> None:
        mgr = self.kv_mgr
        _, why = mgr.bootstrap_wait.get(self.bootstrap_addr, (0, "not asked"))
        self.fail("bootstrap server %s did not tell the prefill ranks in "
                  "%g s (PDX_SGLANG_BOOTSTRAP_TIMEOUT_S): %s"
                  % (self.bootstrap_addr, mgr.bootstrap_timeout, why))

    def send_metadata(self, kv_indices, aux_index: Optional[int] = None,
                      state_indices=None,
                      decode_prefix_len: Optional[int] = None):
        if self.state != KVPoll.WaitingForInput:
            return
        if state_indices and any(s is not None and len(s) for s in
                                 state_indices):
            return self._refuse("pdx.sglang moves the KV pool only; this "
                                "model has state buffers (mamba, SWA, DSA)")
        self.aux_index = aux_index
        mgr = self.kv_mgr
        pages = [int(p) for p in kv_indices]
        skip = int(decode_prefix_len or 0)
        if skip % mgr.shape.page_size:
            return self._refuse("decode_prefix_len %d is not whole pages of "
                                "%d tokens" % (skip, mgr.shape.page_size))
        try:
            pages = self._held(skip // mgr.shape.page_size, pages) + pages
        except ValueError as e:
            return self._refuse(str(e))
        try:
            mgr.track(self.xid, self)
            if self.tp_legs:   # even from one prefill rank: TP 1 -> 2
                mgr.eng.recv(self.xid, None, pages, skip_tokens=skip,
                             peers=self.peers)
            else:
                mgr.eng.recv(self.xid, self.peers[0], pages,
                             skip_tokens=skip)
            self.announced = True
        except pdx.Error as e:
            return self.fail(str(e))
        self.state = KVPoll.Transferring

    def on_event(self, ev: pdx.Event) -> None:
        if not ev.ok:
            self.kv_mgr.forget_prefill(self.bootstrap_addr)
        super().on_event(ev)

    def _refuse(self, why: str) -> None:
        """Fails before any recv, and tells the prefill agents, so that
        the prefill side fails at once rather than at its lease's end."""
        self._abort_at_agent()
        self.fail(why)

    def _held(self, n: int, tail) -> list:
        """n pages standing for the prefix the radix cache holds: pdx's
        recv names every page of the prompt (as many as the sender's) and
        writes none of the first skip_tokens' whole pages, while SGLang
        names only the rest. Any n distinct pages of the pool do, none of
        the rest's; the lowest are taken."""
        taken, held = set(tail), []
        for p in range(self.kv_mgr.pool_pages):
            if len(held) == n:
                break
            if p not in taken:
                held.append(p)
        if len(held) < n:
            raise ValueError("a prefix of %d pages and %d more: the pool "
                             "has %d" % (n, len(tail),
                                         self.kv_mgr.pool_pages))
        return held

    def succeed(self, ev: pdx.Event) -> None:
        try:
            self.kv_mgr.aux.land(self.aux_index, ev.first_token,
                                 self.bootstrap_room, ev.meta)
        except ValueError as e:
            return self.fail(str(e))
        self.state = KVPoll.Success

    def _abort_at_agent(self) -> None:
        super()._abort_at_agent()
        # the prefill side may not have announced its send yet, nor heard
        # of our receive: its agents are told by name, so that the send,
        # when it comes, fails at once rather than waits out the lease
        for peer in self.peers:
            try:
                self.kv_mgr.eng.abort(self.xid, peer)
            except pdx.Error:
                pass
