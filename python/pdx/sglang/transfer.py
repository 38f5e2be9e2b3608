"""What a sender and a receiver share: the transfer id made from the
room, the state poll() reports, pdx's reason when it failed, and the
metric of the event that ended it."""
import logging

import pdx

from .base import KVPoll, KVTransferMetric, PdxTransferError
from .manager import xfer_id

log = logging.getLogger("pdx.sglang")


class Transfer:
    def __init__(self, mgr, bootstrap_addr: str, bootstrap_room):
        self.kv_mgr = mgr
        self.bootstrap_addr = bootstrap_addr
        self.bootstrap_room = int(bootstrap_room or 0)
        self.xid = xfer_id(self.bootstrap_room, mgr.pp_rank)
        self.state = KVPoll.Bootstrapping
        self.reason = ""
        self.announced = False
        self.event = None
        self.conclude_state = None   # decode.py reads it: Failed or None
        # abort() of an announced transfer: Failed only at its event
        self.aborting = False

    def poll(self) -> int:
        if self.state not in (KVPoll.Success, KVPoll.Failed):
            self.kv_mgr.pump()
        return self.state

    def fail(self, reason: str) -> None:
        if self.state in (KVPoll.Success, KVPoll.Failed):
            return
        self.state, self.reason = KVPoll.Failed, reason
        self.conclude_state = KVPoll.Failed
        self.kv_mgr.forget(self.xid)
        log.warning("pdx.sglang: room %d failed: %s", self.bootstrap_room,
                    reason)

    def on_event(self, ev: pdx.Event) -> None:
        self.kv_mgr.forget(self.xid)
        self.event = ev
        if self.aborting:   # whatever the agent managed before the abort
            self.fail("aborted by SGLang")
            return
        if not ev.ok:
            self.fail("%s: %s" % (ev.status_name, ev.reason))
            return
        self.succeed(ev)

    def succeed(self, ev: pdx.Event) -> None:
        self.state = KVPoll.Success

    def failure_exception(self):
        raise PdxTransferError(self.bootstrap_room,
                               self.reason or "no failure")

    def get_transfer_metric(self) -> KVTransferMetric:
        ev = self.event
        if ev is None or not ev.ok:
            return KVTransferMetric()
        span = (ev.t_last_ns - ev.t_first_ns) / 1e9 if ev.t_first_ns else None
        return KVTransferMetric(transfer_latency_s=span,
                                transfer_total_bytes=ev.bytes)

    def abort(self) -> None:
        """SGLang's abort of the request: the transfer ends here and at
        the peer agent. One announced to our agent ends (Failed) only at
        its event: until then the agents may still touch its pages (a
        receive's, written by the sender until it says it stopped), and
        SGLang reuses a request's pages as soon as poll() says Failed."""
        if self.state in (KVPoll.Success, KVPoll.Failed) or self.aborting:
            return
        self._abort_at_agent()
        if self.announced and self.kv_mgr.xfers.get(self.xid) is self:
            self.aborting = True
            self.reason = "aborted by SGLang"
            return
        self.fail("aborted by SGLang")

    def _abort_at_agent(self) -> None:
        # Announced or not: an agent that holds the peer's side of it (a
        # want, a recv) tells the peer, whose transfer then fails at once
        # instead of at its timeout.
        try:
            self.kv_mgr.eng.abort(self.xid)
        except pdx.Error as e:
            log.info("pdx.sglang: abort of room %d: %s",
                     self.bootstrap_room, e)

    def clear(self) -> None:
        self.kv_mgr.forget(self.xid)
