"""PdxKVManager: one per SGLang scheduler (a tensor-parallel rank), in the
prefill or the decode instance. It links to that rank's pdx-agent (the one
PDX_SGLANG_AGENT names, "{rank}" standing for engine_rank, else one it
starts), registers SGLang's KV pool with it, and on the prefill side
registers the agent with the instance's bootstrap server. Its senders and
receivers share its link: poll() drains the link's events into the
transfers they end.

Configuration is by environment, as SGLang's server arguments have no room
for a backend's own (docs/sglang.md): PDX_SGLANG_AGENT, PDX_SGLANG_AGENT_BIN,
PDX_SGLANG_AGENT_ARGS, PDX_SGLANG_AGENT_HOST (its peer link's
address), PDX_SGLANG_XFER_TIMEOUT_MS, PDX_SGLANG_LIVENESS_MS,
PDX_SGLANG_BOOTSTRAP_TIMEOUT_S; and SGLang's own SGLANG_DISAGG_LAYERWISE,
which turns on the senders' per-layer hook (sender.py).
"""
import logging
import os
import shlex
import time
from typing import Dict, List, Optional, Tuple

import pdx
from pdx.vllm.agent import AgentProcess

from . import bootstrap
from .aux import AuxRows
from .base import mode_name
from .layout import Shape, build

log = logging.getLogger("pdx.sglang")

# The decode side asks the bootstrap server from the scheduler's own
# thread (decode.py tries try_ensure_parallel_info every turn while a
# request is pending): each ask is bounded by BOOTSTRAP_ASK_S, and a
# server that did not answer is asked again only BOOTSTRAP_RETRY_S later,
# so that a server down or frozen costs the loop at most 0.2 s a second;
# the receivers waiting on it fail at their deadline
# (PDX_SGLANG_BOOTSTRAP_TIMEOUT_S, from their creation).
BOOTSTRAP_ASK_S = 0.2
BOOTSTRAP_RETRY_S = 1.0


def xfer_id(room: int, pp_rank: int) -> pdx.XferId:
    """The transfer of SGLang's room at pipeline stage pp_rank: both sides
    make it alike. Every tensor-parallel rank uses the same id (its 4
    bytes of rank are 0): each rank has its own agent, and when the two
    instances' TP sizes differ the agents split one transfer of the whole
    instance into legs between the ranks (docs/protocol.md, "TP legs")."""
    return pdx.XferId((room & (2**64 - 1)).to_bytes(8, "big") +
                      bytes(4) + pp_rank.to_bytes(4, "big"))


class PrefillInfo:
    """What decode.py reads of a prefill instance (prefill_info_table)."""

    def __init__(self, sizes: dict):
        self.dp_size = int(sizes["dp_size"])
        self.attn_tp_size = int(sizes["attn_tp_size"])
        self.pp_size = int(sizes["pp_size"])
        self.follow_bootstrap_room = bool(sizes.get("follow_bootstrap_room",
                                                    True))


def _env_int(name: str) -> int:
    return int(os.environ.get(name, "0") or 0)


def env_on(name: str) -> bool:
    """An SGLang switch in the environment (1, true, yes, on)."""
    return os.environ.get(name, "").lower() in ("1", "true", "yes", "on")


def parallel_sizes(sa) -> dict:
    """An instance's sizes, from its server_args, as its bootstrap server
    says them."""
    tp = int(getattr(sa, "tp_size", 1) or 1)
    dp = int(getattr(sa, "dp_size", 1) or 1)
    # DP attention splits the tensor-parallel ranks into dp groups
    dp_attn = bool(getattr(sa, "enable_dp_attention", False))
    # a prefill instance routes a room to DP rank room % dp_size unless
    # told otherwise ("auto" is that for a prefill instance); else each
    # request's DP rank is registered (sender.py)
    follow = getattr(sa, "load_balance_method", "auto") in (
        "auto", "follow_bootstrap_room", None)
    return {"attn_tp_size": tp // dp if dp_attn else tp,
            "pp_size": int(getattr(sa, "pp_size", 1) or 1),
            "dp_size": dp, "follow_bootstrap_room": follow}


def refuse_unsupported(args, sa) -> None:
    """What pdx.sglang cannot move, refused when the instance starts
    (RuntimeError naming it): hybrid and sparse models' state buffers,
    which SGLang names in kv_args.state_types before the manager is built
    (refused per request, each failed only after its whole prefill), and
    decode or prefill context parallelism, whose KV indices are not the
    pool's pages (SGLang's own managers refuse DCP: the transfer would
    silently corrupt the KV)."""
    states = [getattr(t, "value", t) for t in
              getattr(args, "state_types", None) or []]
    if states:
        raise RuntimeError(
            "pdx.sglang moves the KV pool only; this model also keeps "
            "state buffers (%s), which it cannot move" % ", ".join(
                str(t) for t in states))
    for what, size in (("dcp_size", getattr(args, "dcp_size", 1)),
                       ("attn_cp_size", getattr(sa, "attn_cp_size", 1))):
        if int(size or 1) > 1:
            raise RuntimeError(
                "pdx.sglang does not move KV under context parallelism "
                "(%s %d): run the disaggregated instance with 1" %
                (what, int(size)))


def bootstrap_host(sa) -> str:
    """Where an instance's bootstrap server is, as its prefill ranks reach
    it (SGLang's register_to_bootstrap): the host of --dist-init-addr
    when given (node 0, whose frontend runs the server: a rank on another
    node reached only its own host, and the instance failed to start),
    else --host, a wildcard as the loopback of its family."""
    dist = getattr(sa, "dist_init_addr", None)
    if dist:   # HOST:PORT, or [IPv6]:PORT
        return dist[:dist.index("]") + 1] if dist.startswith("[") \
            else dist.rsplit(":", 1)[0]
    host = getattr(sa, "host", None) or "127.0.0.1"
    return {"0.0.0.0": "127.0.0.1", "::": "[::1]"}.get(
        host, "[%s]" % host if ":" in host else host)


class PdxKVManager:
    def __init__(self, args, disaggregation_mode, server_args,
                 is_mla_backend: Optional[bool] = False):
        refuse_unsupported(args, server_args)
        self.kv_args = args
        self.mode = mode_name(disaggregation_mode)
        self.server_args = server_args
        self.is_mla_backend = bool(is_mla_backend)
        # prefill.py gives the instance's TP rank, decode.py its attention
        # TP rank; with DP attention the TP ranks form dp_size attention
        # groups of attn_tp_size, and a rank's group is its DP rank
        self.sizes = sizes = parallel_sizes(server_args)
        self.engine_rank = int(args.engine_rank)
        self.rank = self.engine_rank % sizes["attn_tp_size"]
        self.pp_rank = int(getattr(args, "pp_rank", 0) or 0)
        self.dp_rank = (self.engine_rank // sizes["attn_tp_size"]
                        if getattr(server_args, "enable_dp_attention", False)
                        else int(getattr(args, "system_dp_rank", 0) or 0))
        self.bootstrap_host = bootstrap_host(server_args)
        self.bootstrap_port = getattr(server_args,
                                      "disaggregation_bootstrap_port", None)
        self.bootstrap_timeout = float(os.environ.get(
            "PDX_SGLANG_BOOTSTRAP_TIMEOUT_S", "30"))
        self.layerwise = env_on("SGLANG_DISAGG_LAYERWISE")
        self.start_layer = int(getattr(args, "prefill_start_layer", 0) or 0)
        self.agent = None
        addr = os.environ.get("PDX_SGLANG_AGENT")
        if addr:
            addr = addr.replace("{rank}", str(self.engine_rank))
        else:
            self.agent = AgentProcess(
                os.environ.get("PDX_SGLANG_AGENT_BIN", "pdx-agent"),
                os.environ.get("PDX_SGLANG_AGENT_HOST", "127.0.0.1"),
                args=shlex.split(os.environ.get("PDX_SGLANG_AGENT_ARGS", "")),
                listen_host_key="PDX_SGLANG_AGENT_HOST")
            addr = self.agent.engine_addr
        self.agent_addr = addr
        self.eng = pdx.Engine(addr,
                              xfer_timeout_ms=_env_int(
                                  "PDX_SGLANG_XFER_TIMEOUT_MS"),
                              liveness_ms=_env_int("PDX_SGLANG_LIVENESS_MS"))
        self.tp_size = sizes["attn_tp_size"]
        self.shape, lay, regions, self.cuda = build(args, self.is_mla_backend,
                                                    self.tp_size)
        self.pool_pages = lay.blocks
        if self.tp_size > 1:  # the agents reshard to other TP sizes
            self.eng.set_tp(self.rank, self.tp_size)
        self.peer_addr = self.eng.register(
            lay, regions, cuda_event_slots=4 if self.cuda else 0)
        self.aux = AuxRows(args)
        self.xfers: Dict[pdx.XferId, object] = {}  # announced -> its end
        self.prefill_info_table: Dict[str, PrefillInfo] = {}
        self.prefill_regs: Dict[tuple, List[dict]] = {}  # (addr, dp rank)
        # a bootstrap server that cannot say yet: (not asked again
        # before, why)
        self.bootstrap_wait: Dict[str, Tuple[float, str]] = {}
        log.info("pdx.sglang: %s rank %d registered %d layers with %s",
                 self.mode, self.rank, self.shape.layers, self.peer_addr)
        if self.mode == "prefill":
            self.register_to_bootstrap()

    # -- bootstrap -------------------------------------------------------
    def register_to_bootstrap(self) -> None:
        """Tells the instance's bootstrap server this rank's agent and
        layout; waits for the server (it may start after this rank)."""
        reg = dict(self.sizes, attn_tp_rank=self.rank,
                   pp_rank=self.pp_rank, dp_rank=self.dp_rank,
                   peer_addr=self.peer_addr, shape=vars(self.shape))
        addr = "%s:%s" % (self.bootstrap_host, self.bootstrap_port)
        end = time.monotonic() + self.bootstrap_timeout
        while True:
            try:
                return bootstrap.register(addr, reg)
            except OSError as e:
                if time.monotonic() > end:
                    raise RuntimeError("pdx.sglang: cannot register with "
                                       "the bootstrap server %s: %s"
                                       % (addr, e))
                time.sleep(0.1)

    def try_ensure_parallel_info(self, bootstrap_addr: str) -> bool:
        """decode.py: whether the prefill instance's sizes are known (asks
        its bootstrap server when not, bounded: _ask)."""
        if bootstrap_addr in self.prefill_info_table:
            return True
        sizes = self._ask(bootstrap_addr, -1, -1, -1)
        if sizes is None:
            return False
        self.prefill_info_table[bootstrap_addr] = PrefillInfo(sizes)
        return True

    def prefill_ranks(self, bootstrap_addr: str,
                      dp_rank: int) -> Optional[List[dict]]:
        """The prefill ranks this decode rank receives from (their agents
        and layouts): its own rank's at equal TP sizes, else every rank's
        (the agents take this rank's heads from those that hold them).
        None while the server cannot say yet; LookupError when it will
        not."""
        if not self.try_ensure_parallel_info(bootstrap_addr):
            return None
        info = self.prefill_info_table[bootstrap_addr]
        if info.pp_size != self.sizes["pp_size"]:
            raise LookupError(
                "pdx.sglang: prefill %s has pp_size %d, this decode %d: "
                "pipeline stages must pair" % (
                    bootstrap_addr, info.pp_size, self.sizes["pp_size"]))
        key = (bootstrap_addr, dp_rank)
        if key in self.prefill_regs:
            return self.prefill_regs[key]
        ranks = [self.rank] if info.attn_tp_size == self.tp_size else \
            range(info.attn_tp_size)
        regs = [self._ask(bootstrap_addr, dp_rank, r, self.pp_rank)
                for r in ranks]
        if None in regs:
            return None
        # asked once, as SGLang's receivers keep their bootstrap infos:
        # the scheduler's thread makes these calls, one per request would
        # cost it a round trip per prefill rank
        self.prefill_regs[key] = regs
        return regs

    def _ask(self, addr: str, dp: int, tp: int, pp: int) -> Optional[dict]:
        """bootstrap.ask, bounded (above): None while the server cannot
        say (why in bootstrap_wait), without asking while it is down."""
        wait = self.bootstrap_wait.get(addr)
        if wait is not None and time.monotonic() < wait[0]:
            return None
        try:
            got = bootstrap.ask(addr, dp, tp, pp, timeout=BOOTSTRAP_ASK_S)
        except OSError as e:
            self.bootstrap_wait[addr] = (time.monotonic() +
                                         BOOTSTRAP_RETRY_S, str(e))
            return None
        if got is None:   # it answered: asked again at once
            self.bootstrap_wait[addr] = (0.0, "not every prefill rank "
                                         "registered with it")
        else:
            self.bootstrap_wait.pop(addr, None)
        return got

    def forget_prefill(self, bootstrap_addr: str) -> None:
        """A transfer from that instance failed: it may have restarted
        (other agents, another layout), so its ranks are asked afresh
        (its sizes stay: decode.py reads prefill_info_table without
        asking again)."""
        for key in [k for k in self.prefill_regs if k[0] == bootstrap_addr]:
            del self.prefill_regs[key]

    def submit_prefill_recompute(self, kv_receiver, payload: dict) -> None:
        """decode.py's PD retraction with rebootstrap (a request retracted
        while its weights were updated): SGLang's managers have the
        prefill instance compute it again (POST /generate to the port it
        registered) and send its KV anew. pdx.sglang does not drive that
        yet, so the request fails saying so, as a failed /generate does
        there; before, the missing method stopped the decode scheduler."""
        kv_receiver.abort("pdx.sglang cannot rebootstrap a retracted "
                          "request (rid %s): the prefill instance is not "
                          "asked to compute it again" % payload.get("rid"))

    def layout_differs(self, reg: dict, their_tp: int) -> str:
        """"" when the prefill rank's layout (reg's, of an instance of
        their_tp ranks) pairs with ours, else why not in words."""
        if "shape" in reg and reg["shape"] is None:
            # a server that does not know the layout (pdx-proxy's for a
            # pdx-engine prefill): the agents compare when they pair
            return ""
        try:
            theirs = Shape(**reg["shape"])
        except (KeyError, TypeError) as e:
            return "its registration has no layout (%s)" % e
        why = theirs.differs(self.shape, their_tp, self.tp_size)
        return "layout differs (prefill vs decode): " + why if why else ""

    # -- events ----------------------------------------------------------
    def track(self, xid: pdx.XferId, end) -> None:
        self.xfers[xid] = end

    def forget(self, xid: pdx.XferId) -> None:
        self.xfers.pop(xid, None)

    def pump(self) -> None:
        """Hands every event waiting on the link to its sender or
        receiver (on_event)."""
        try:
            events = self.eng.events()
        except pdx.Error as e:
            self._link_lost(e)
            return
        for ev in events:
            self._hand(ev)

    def pump_until(self, done, timeout: float) -> bool:
        """Waits on the link, handing its events on as pump() does, until
        done() holds or timeout seconds passed; done() at the end."""
        end = time.monotonic() + timeout
        while not done():
            left = end - time.monotonic()
            if left <= 0:
                return False
            try:
                ev = self.eng.wait_event(min(left, 0.1))
            except pdx.Error as e:
                self._link_lost(e)
                return done()
            if ev is not None:
                self._hand(ev)
        return True

    def _hand(self, ev: pdx.Event) -> None:
        end = self.xfers.get(ev.xfer)
        if end is not None:
            end.on_event(ev)

    def _link_lost(self, e: pdx.Error) -> None:
        for end in list(self.xfers.values()):
            end.fail("pdx link: %s" % e)

    def close(self) -> None:
        self.eng.close()
        if self.agent is not None:
            self.agent.stop()
