"""PdxKVSender: the prefill side of one request (one room) on one rank.

SGLang's order (prefill.py): built when the request arrives, polled until
not Bootstrapping, init(num_pages, aux_index), then send(page_indices) for
each chunk (whole pages; the last chunk the rest, after set_buf wrote the
aux row), polled until Success or Failed. pdx announces a transfer with
all its blocks, so the pages gather until init's count is reached; then
the transfer is announced (pushed to the agent that claims it: the decode
rank's, which names our agent) and the first token rides with it.
Nothing is asked of the decode side first, so the bootstrap is over at
once (WaitingForInput).

When is each layer done: after the forward (SGLang 0094505d's prefill.py
sends then), every layer at once in send(). Layer-wise (the per-layer
hook of another SGLang commit, layerwise_hooks.py: set_layerwise_indices before
the forward, start_layerwise_send, save_kv_layer per layer,
finalize_layerwise_send; docs/sglang.md), the forward of the last chunk
announces the transfer with all pages before its first layer (earlier
chunks' pages are complete) and each save_kv_layer is a pdx layer_done,
so layers move while later ones compute. The last layer is held until
the post-forward send(): pdx takes the first token before the last
layer_done, and the token is sampled after the forward. Earlier chunks'
forwards are not layer-wise: their pages (named by the hook or by send())
travel with the last chunk's.
"""
from typing import List, Optional

import pdx

from . import bootstrap
from .base import KVPoll
from .manager import env_on
from .transfer import Transfer


class PdxKVSender(Transfer):
    def __init__(self, mgr, bootstrap_addr: str, bootstrap_room: int,
                 dest_tp_ranks: List[int] = None, pp_rank: int = 0,
                 req_has_disagg_prefill_dp_rank: bool = False):
        super().__init__(mgr, bootstrap_addr, bootstrap_room)
        self.state = KVPoll.WaitingForInput
        self.num_pages = None
        self.aux_index = None
        self.pages: List[int] = []
        self.done_layers = set()
        self.forward_pages: List[int] = []   # set_layerwise_indices'
        if not req_has_disagg_prefill_dp_rank:
            self._dp_rank_known(bootstrap_addr)

    def _dp_rank_known(self, bootstrap_addr: str) -> None:
        """DP attention: the decode side must find the DP rank this room
        runs on. Routed by the room (follow_bootstrap_room), it is room %
        dp_size, and a request routed elsewhere (another DP rank named
        from outside) fails, as SGLang's own senders do, unless
        SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK allows it;
        otherwise it is registered with the bootstrap server, which the
        decode side asks (/query_dp_ranks). Not asked when the request
        names its prefill DP rank (req_has_disagg_prefill_dp_rank: the
        decode side has it from the request, SGLang's CommonKVSender;
        such requests failed here)."""
        mgr = self.kv_mgr
        sizes = mgr.sizes
        dp = sizes["dp_size"]
        if dp <= 1:
            return
        if sizes["follow_bootstrap_room"] and \
                self.bootstrap_room % dp == mgr.dp_rank:
            return
        if sizes["follow_bootstrap_room"] and not env_on(
                "SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK"):
            return self.fail(
                "follow_bootstrap_room conflict: dispatched to dp_rank %d "
                "but bootstrap_room %d implies dp_rank %d (set "
                "SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK=1 to "
                "allow mixed routing)" % (mgr.dp_rank, self.bootstrap_room,
                                          self.bootstrap_room % dp))
        try:
            bootstrap.register_dp_rank(bootstrap_addr, self.bootstrap_room,
                                       mgr.dp_rank)
        except OSError as e:
            self.fail("cannot register room %d's DP rank with the "
                      "bootstrap server %s: %s" % (self.bootstrap_room,
                                                   bootstrap_addr, e))

    def init(self, num_kv_indices: int, aux_index: Optional[int] = None):
        self.num_pages, self.aux_index = int(num_kv_indices), aux_index

    def pop_decode_prefix_len(self) -> int:
        return 0

    def should_send_kv_chunk(self, num_pages: int, last_chunk: bool) -> bool:
        return num_pages > 0 or last_chunk

    def _refuse_state(self, state_indices) -> bool:
        if state_indices and any(s is not None and len(s) for s in
                                 state_indices):
            self.fail("pdx.sglang moves the KV pool only; this model has "
                      "state buffers (mamba, SWA, DSA)")
            return True
        return False

    def send(self, kv_indices, state_indices=None,
             token_position_offset: int = 0,
             num_kv_tokens: Optional[int] = None):
        """num_kv_tokens (a later SGLang's: the chunk's tokens) is taken
        and not needed: pages move whole, the decode side reads its own
        tokens of them."""
        if self.announced and self.state == KVPoll.Transferring:
            # announced layer-wise: this chunk's pages are in it already
            return self._finish()
        if self.state != KVPoll.WaitingForInput:
            return
        if self.num_pages is None:
            return self.fail("send() before init()")
        if self._refuse_state(state_indices):
            return
        self._gather(kv_indices)
        if len(self.pages) > self.num_pages:
            return self.fail("%d pages sent, init() said %d"
                             % (len(self.pages), self.num_pages))
        if len(self.pages) == self.num_pages and self._announce():
            self._finish()

    def _gather(self, pages) -> None:
        """Pages in token order, each once: a chunk's forward names its
        partial last page again in the next (set_layerwise_indices), and
        its send() may come after that forward or not at all."""
        have = set(self.pages)
        for p in pages:
            p = int(p)
            if p not in have:
                have.add(p)
                self.pages.append(p)

    def _announce(self) -> bool:
        mgr = self.kv_mgr
        try:
            mgr.track(self.xid, self)
            mgr.eng.send(self.xid, None, self.pages)
        except pdx.Error as e:
            self.fail(str(e))
            return False
        self.announced = True
        self.state = KVPoll.Transferring
        return True

    def _finish(self) -> None:
        """The forward is over and the aux row written: the first token
        and the aux rows (aux.py), then every layer not marked done yet."""
        mgr = self.kv_mgr
        try:
            token = mgr.aux.first_token(self.aux_index)
            if token is not None and token >= 0:  # below 0: no token
                mgr.eng.token(self.xid, token)
            rows = mgr.aux.pack(self.aux_index)
            if rows:
                mgr.eng.meta(self.xid, rows)
            for layer in range(mgr.shape.layers):
                self._layer_done(layer)
        except pdx.Error as e:
            self._abort_at_agent()
            self.fail(str(e))

    def _layer_done(self, layer: int) -> None:
        if layer in self.done_layers:
            return
        self.done_layers.add(layer)
        mgr = self.kv_mgr
        if mgr.cuda:   # recorded on SGLang's stream: no synchronize
            mgr.eng.layer_done(layer, [self.xid],
                               stream=pdx.current_stream())
        else:
            mgr.eng.layer_done(layer, [self.xid])

    # -- the per-layer hook (layerwise_hooks.py) -------------------------
    @property
    def is_layerwise_enabled(self) -> bool:
        return self.kv_mgr.layerwise

    @property
    def layerwise_kv_fully_dispatched(self) -> bool:
        # the last layer waits for send(): SGLang must call it
        return False

    def set_layerwise_indices(self, prefill_kv_indices,
                              dst_kv_indices=None) -> None:
        """The scheduler, before the forward: the pages it computes."""
        self.forward_pages = [int(p) for p in prefill_kv_indices]

    def start_layerwise_send(self, num_layers: int) -> None:
        """The forward begins: when it is the last chunk's (its pages
        complete init's count), the transfer is announced now."""
        if self.state != KVPoll.WaitingForInput or self.num_pages is None:
            return
        self._gather(self.forward_pages)
        if len(self.pages) == self.num_pages:
            self._announce()   # else an earlier chunk's: nothing moves yet

    def save_kv_layer(self, layer_id: int) -> None:
        """The layer (the model's id: with pipeline stages, counted from
        the first stage's) is computed into this transfer's pages."""
        layer = layer_id - self.kv_mgr.start_layer
        if not self.announced or self.state != KVPoll.Transferring or \
                layer == self.kv_mgr.shape.layers - 1:
            return
        try:
            self._layer_done(layer)
        except pdx.Error as e:
            self._abort_at_agent()
            self.fail(str(e))

    def wait_compute_on_transfer(self) -> None:
        """pdx's agent moves the KV: nothing on this side's streams."""

    def finalize_layerwise_send(self) -> None:
        """The last layer and the token come with send()."""
        self.forward_pages = []
