"""What a sender and a receiver share: the transfer id made from the
room, the state poll() reports, pdx's reason when it failed, and the
metric of the event that ended it."""
import logging

import pdx

from .base import KVPoll, KVTransferMetric, PdxTransferError
from .manager import xfer_id

log = logging.getLogger("pdx.sglang")

# How long failure_exception() waits for pdx's event of a transfer it ends
# because another rank's failed: above the agents' bound for a receive
# whose sender has not said it stopped writing (4 x --peer-timeout-ms
# while the sender answers pings, 20 s by default), with a margin.
STOP_WAIT_S = 25.0


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
            self.fail(self.reason)
            return
        if not ev.ok:
            self.fail("%s: %s" % (ev.status_name, ev.reason))
            return
        self.succeed(ev)

    def succeed(self, ev: pdx.Event) -> None:
        self.state = KVPoll.Success

    def failure_exception(self):
        """SGLang asks why once the ranks' polls, reduced to their
        minimum, said Failed; every rank then frees the request's pages.
        Here the failure may be another rank's, with this rank's transfer
        still under way: the agents may still write (decode) or read
        (prefill) its pages. It ends that transfer first, and returns
        only once pdx's event says they stopped (or STOP_WAIT_S passed)."""
        if self.state == KVPoll.Failed:
            raise PdxTransferError(self.bootstrap_room, self.reason)
        why = "another tensor-parallel rank's transfer failed"
        if self.state != KVPoll.Success:
            self.abort(why)
            if not self.kv_mgr.pump_until(
                    lambda: self.state == KVPoll.Failed, STOP_WAIT_S):
                log.error("pdx.sglang: room %d: no event from the agent "
                          "%.0f s after its abort: its pages may still be "
                          "in use", self.bootstrap_room, STOP_WAIT_S)
                self.fail(why)
        raise PdxTransferError(self.bootstrap_room, why,
                               is_from_another_rank=True)

    def get_transfer_metric(self) -> KVTransferMetric:
        ev = self.event
        if ev is None or not ev.ok:
            return KVTransferMetric()
        span = (ev.t_last_ns - ev.t_first_ns) / 1e9 if ev.t_first_ns else None
        return KVTransferMetric(transfer_latency_s=span,
                                transfer_total_bytes=ev.bytes)

    def abort(self, why: str = "aborted by SGLang") -> None:
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
            self.reason = why
            return
        self.fail(why)

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
