"""PdxKVSender: the prefill side of one request (one room) on one rank.

SGLang's order (prefill.py): built when the request arrives, polled until
not Bootstrapping, init(num_pages, aux_index), then send(page_indices) for
each chunk (whole pages; the last chunk the rest, after set_buf wrote the
aux row), polled until Success or Failed. pdx announces a transfer with
all its blocks, so the pages gather until init's count is reached; then
the transfer is announced (pushed to the agent that claims it: the decode
rank's, which names our agent), the first token rides with it, and every
layer is done at once: SGLang sends after the forward, when all are.
Nothing is asked of the decode side first, so the bootstrap is over at
once (WaitingForInput).
"""
from typing import List, Optional

import pdx

from .base import KVPoll
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

    def init(self, num_kv_indices: int, aux_index: Optional[int] = None):
        self.num_pages, self.aux_index = int(num_kv_indices), aux_index

    def pop_decode_prefix_len(self) -> int:
        return 0

    def should_send_kv_chunk(self, num_pages: int, last_chunk: bool) -> bool:
        return num_pages > 0 or last_chunk

    def send(self, kv_indices, state_indices=None,
             token_position_offset: int = 0):
        if self.state != KVPoll.WaitingForInput:
            return
        if self.num_pages is None:
            return self.fail("send() before init()")
        if state_indices and any(s is not None and len(s) for s in
                                 state_indices):
            return self.fail("pdx.sglang moves the KV pool only; this "
                             "model has state buffers (mamba, SWA, DSA)")
        self.pages.extend(int(p) for p in kv_indices)
        if len(self.pages) > self.num_pages:
            return self.fail("%d pages sent, init() said %d"
                             % (len(self.pages), self.num_pages))
        if len(self.pages) == self.num_pages:
            self._announce()

    def _announce(self) -> None:
        mgr = self.kv_mgr
        try:
            mgr.track(self.xid, self)
            mgr.eng.send(self.xid, None, self.pages)
            self.announced = True
            token = mgr.aux.first_token(self.aux_index)
            if token is not None:
                mgr.eng.token(self.xid, token)
            for layer in range(mgr.shape.layers):
                self.save_kv_layer(layer)
        except pdx.Error as e:
            self._abort_at_agent()
            return self.fail(str(e))
        self.state = KVPoll.Transferring

    def save_kv_layer(self, layer_id: int) -> None:
        """The layer is computed into this transfer's pages."""
        mgr = self.kv_mgr
        if mgr.cuda:
            import torch
            mgr.eng.layer_done(layer_id, [self.xid],
                               stream=torch.cuda.current_stream())
        else:
            mgr.eng.layer_done(layer_id, [self.xid])
