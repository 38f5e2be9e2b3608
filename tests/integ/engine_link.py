#!/usr/bin/python3
"""engine_link: the engine link's edges, met by an engine written in Python
from docs/protocol.md alone (pyzmq + msgpack, see pypeer.py), against
three real pdx-agents: P (prefill), D (decode) and U (never registered).

Checked, each as docs/protocol.md section 1 says:
  - a recv or send before register ends in one `failed` event (not
    registered), to the connection that sent it;
  - an engine that reconnects (a new socket) without registering again has
    its send and recv refused with a `failed` event and its other ops with
    an `error`, both saying to register; once registered again, its events
    come to the new socket, the transfers of the old one's included;
  - a recv with the id of a transfer in flight is answered `error` (that
    id, EEXIST), not with an event; the transfer goes on, one event;
  - a recv whose skip_tokens covers every block still waits for the
    prefill side's `done`, so `received` carries its first token;
  - a block id twice in a recv or a send: `failed`, naming both places;
  - a recv from an address where no agent listens fails at the handshake
    bound (--handshake-timeout-ms), not at the transfer timeout;
  - refusals name the field at fault; a layout refusal names the kinds
    (MLA against K and V);
  - a malformed optional field (skip_tokens, timeout_ms, pull) fails the
    transfer naming it, and a recv's sender is told at once; timeout_ms 0
    is the agent's default; a send or recv naming its own agent is
    refused, saying so;
  - an engine that shrinks its pool under the agents fails the transfer
    that copies into it or from it (EIO): no agent dies of SIGBUS.

    engine_link.py PATH-TO-pdx-agent

Exits 0 (pass), 1 (fail) or 77 (skip: pyzmq or msgpack missing).
"""
import os
import random
import sys
import time

from pypeer import (BLOCK_TOKENS, BLOCKS, LAYERS, Rig, check,
                    exit_code, free_port, layout, zmq)

PDX_EINVAL, PDX_ERANGE, PDX_EEXIST = -1, -2, -4
PDX_EPEER, PDX_EIO, PDX_ENOTREG = -100, -201, -202
HANDSHAKE_MS = 600


def reply(e, ops, ms=3000):
    """The next message for e within ms whose op is one of ops (a string
    or a tuple); events on the way are kept, anything else dropped."""
    end = time.time() + ms / 1000
    ops = (ops,) if isinstance(ops, str) else ops
    while True:
        left = int((end - time.time()) * 1000)
        m = e.recv(left) if left > 0 else None
        if m is None or m.get("op") in ops:
            return m
        if m.get("op") == "event":
            e.events.setdefault(m["xfer"], []).append(m)


def register(e, lay=None):
    """Registers once; the answer (registered or error) or None."""
    e.send({"op": "register", "v": 1, "layout": lay or layout(),
            "regions": [{"type": "shm", "name": "/" + e.shm.name,
                         "size": e.shm.size}]})
    return reply(e, ("registered", "error"), 5000)


def kv_dtype_said_back(e):
    """A register naming a kv_dtype hears it back (an engine whose agent
    does not, one from before kv_dtype, knows its type goes unchecked);
    registered again without one, it hears none."""
    e.send({"op": "register", "v": 1, "layout": layout(),
            "kv_dtype": "bfloat16",
            "regions": [{"type": "shm", "name": "/" + e.shm.name,
                         "size": e.shm.size}]})
    r = reply(e, ("registered", "error"), 5000)
    check(r is not None and r.get("op") == "registered" and
          r.get("kv_dtype") == "bfloat16",
          f"a register naming kv_dtype bfloat16 hears it back: {r}")
    r = register(e)
    check(r is not None and r.get("op") == "registered" and
          "kv_dtype" not in r,
          f"registered again naming none: no kv_dtype back: {r}")


def run_transfer(P, D, addrs, dst, src, token=None, skip_tokens=0):
    """One transfer, every layer computed; (decode event, prefill event)."""
    x = os.urandom(16)
    recv = {"op": "recv", "xfer": x, "peer": addrs["P"], "blocks": dst}
    if skip_tokens:
        recv["skip_tokens"] = skip_tokens
    D.send(recv)
    P.send({"op": "send", "xfer": x, "peer": addrs["D"], "blocks": src})
    if token is not None:
        P.send({"op": "token", "xfer": x, "token": token})
    for layer in range(LAYERS):
        P.send({"op": "layer_done", "layer": layer, "xfers": [x]})
    return D.event(x), P.event(x)


def before_register(U):
    for op in ("recv", "send"):
        x = os.urandom(16)
        U.send({"op": op, "xfer": x, "peer": "tcp://127.0.0.1:9",
                "blocks": [1, 2]})
        ev = U.event(x, 3000)
        check(ev is not None and ev["kind"] == "failed" and
              ev["status"] == PDX_ENOTREG and "register" in ev["reason"],
              f"{op} before register: one failed event, not registered: {ev}")
    U.send({"op": "hold", "xfer": os.urandom(16), "peer": "tcp://127.0.0.1:9"})
    r = reply(U, "error")
    check(r is not None and r["status"] == PDX_ENOTREG and
          r.get("refused") == "hold",
          f"hold before register: error, not registered: {r}")


def reconnect(rig, D, P, addrs, dst, src):
    """D's engine drops its socket, with a recv in flight, and connects a
    new one: the close ends the registration (docs/protocol.md, "The
    engine's end")."""
    old = os.urandom(16)
    D.send({"op": "recv", "xfer": old, "peer": addrs["P"], "blocks": dst})
    D.pump(100)
    D.sock.close()
    D.sock = rig.ctx.socket(zmq.DEALER)
    D.sock.setsockopt(zmq.LINGER, 0)
    D.sock.connect(f"ipc://{rig.tmp}/D.engine")
    x = os.urandom(16)
    D.send({"op": "recv", "xfer": x, "peer": addrs["P"], "blocks": dst})
    ev = D.event(x, 3000)
    check(ev is not None and ev["kind"] == "failed" and
          ev["status"] == PDX_ENOTREG and "register" in ev["reason"],
          f"a recv on a new socket, not registered on it: failed there: {ev}")
    for msg in ({"op": "layer_done", "layer": 0, "xfers": [x]},
                {"op": "token", "xfer": x, "token": 7},
                {"op": "abort", "xfer": x}):
        D.send(msg)
        r = reply(D, "error")
        check(r is not None and r["status"] == PDX_ENOTREG and
              r.get("refused") == msg["op"] and "register" in r["reason"],
              f"{msg['op']} on the new socket: error, register first: {r}")
    r = register(D)
    check(r is not None and r.get("op") == "registered",
          f"the new socket registers: {r}")
    addrs["D"] = r["peer"]
    # the old socket's close ended its registration, and its recv with
    # it (its event went to that socket): announced again, the id fails
    # saying why
    D.send({"op": "recv", "xfer": old, "peer": addrs["P"], "blocks": dst})
    ev = D.event(old, 3000)
    check(ev is not None and ev["kind"] == "failed" and
          "engine gone" in ev["reason"],
          f"the recv of the old socket ended when it closed: {ev}")
    got_d, got_p = run_transfer(P, D, addrs, dst, src)
    check(got_d is not None and got_d["kind"] == "received",
          f"registered again: the events come to the new socket: {got_d}")
    check(got_p is not None and got_p["kind"] == "sent",
          f"registered again: the prefill side sent: {got_p}")


def duplicate_id(P, D, addrs, dst, src):
    x = os.urandom(16)
    D.send({"op": "recv", "xfer": x, "peer": addrs["P"], "blocks": dst})
    D.send({"op": "recv", "xfer": x, "peer": addrs["P"], "blocks": dst})
    r = reply(D, "error")
    check(r is not None and r.get("xfer") == x and
          r["status"] == PDX_EEXIST and r.get("refused") == "recv" and
          "xfer" in r["reason"],
          f"recv twice: the repeat is answered error, EEXIST, that id: {r}")
    P.send({"op": "send", "xfer": x, "peer": addrs["D"], "blocks": src})
    for layer in range(LAYERS):
        P.send({"op": "layer_done", "layer": layer, "xfers": [x]})
    got_d, got_p = D.event(x), P.event(x)
    check(got_d is not None and got_d["kind"] == "received" and
          got_p is not None and got_p["kind"] == "sent",
          f"recv twice: the transfer goes on ({got_d and got_d['kind']}, "
          f"{got_p and got_p['kind']})")
    D.pump(300)
    check(D.n_events(x) == 1, f"recv twice: one event ({D.n_events(x)})")


def skip_all(P, D, addrs, dst, src):
    got_d, got_p = run_transfer(P, D, addrs, dst, src, token=4242,
                                skip_tokens=len(dst) * BLOCK_TOKENS)
    check(got_d is not None and got_d["kind"] == "received" and
          got_d["first_token"] == 4242 and got_d["bytes"] == 0,
          f"skip_tokens covering every block: received, the prefill's "
          f"first token, 0 bytes: {got_d}")
    check(got_p is not None and got_p["kind"] == "sent",
          f"skip_tokens covering every block: the prefill side sent: {got_p}")


def duplicate_blocks(P, D, addrs):
    for e, op, peer in ((D, "recv", addrs["P"]), (P, "send", addrs["D"])):
        x = os.urandom(16)
        e.send({"op": op, "xfer": x, "peer": peer, "blocks": [5, 6, 7, 6]})
        ev = e.event(x, 2000)
        check(ev is not None and ev["kind"] == "failed" and
              ev["status"] == PDX_EINVAL and "blocks[3]" in ev["reason"] and
              "blocks[1]" in ev["reason"],
              f"{op} naming block 6 twice: failed at once, naming both: {ev}")


def nobody_there(D):
    x = os.urandom(16)
    t0 = time.time()
    D.send({"op": "recv", "xfer": x, "peer": f"tcp://127.0.0.1:{free_port()}",
            "blocks": [1, 2], "timeout_ms": 20000})
    ev = D.event(x, 4000)
    took = time.time() - t0
    check(ev is not None and ev["kind"] == "failed" and
          ev["status"] == PDX_EPEER and "hello" in ev["reason"],
          f"a recv from where no agent listens fails, no answer to hello: {ev}")
    check(ev is not None and took < HANDSHAKE_MS / 1000 + 3,
          f"... at the handshake bound ({HANDSHAKE_MS} ms), not the "
          f"transfer's 20 s (after {took:.1f} s)")


def fields_named(P, D, addrs):
    x = os.urandom(16)
    D.send({"op": "recv", "xfer": x, "blocks": [1]})
    ev = D.event(x, 2000)
    check(ev is not None and ev["kind"] == "failed" and
          ev["reason"].startswith("peer"),
          f"recv without peer: the reason names peer: {ev}")
    x = os.urandom(16)
    D.send({"op": "recv", "xfer": x, "peer": addrs["P"], "blocks": "1"})
    ev = D.event(x, 2000)
    check(ev is not None and ev["kind"] == "failed" and
          ev["reason"].startswith("blocks"),
          f"recv with blocks not an array: the reason names blocks: {ev}")
    x = os.urandom(16)
    D.send({"op": "recv", "xfer": x, "peer": addrs["P"], "blocks": [1, BLOCKS]})
    ev = D.event(x, 2000)
    check(ev is not None and ev["status"] == PDX_ERANGE and
          "blocks[1]" in ev["reason"],
          f"a block past the pool: the reason names blocks[1]: {ev}")
    D.send({"op": "recv", "xfer": b"short", "peer": addrs["P"], "blocks": [1]})
    r = reply(D, "error")
    check(r is not None and r.get("refused") == "recv" and
          r["reason"].startswith("xfer"),
          f"recv with a 5-byte id: error naming xfer: {r}")
    D.send({"op": "layer_done", "xfers": [x]})
    r = reply(D, "error")
    check(r is not None and r.get("refused") == "layer_done" and
          r["reason"].startswith("layer"),
          f"layer_done without layer: error naming layer: {r}")
    lay = layout()
    del lay["head_dim"]
    r = register(D, lay)
    check(r is not None and r.get("op") == "error" and
          "head_dim" in r["reason"],
          f"a layout without head_dim: refused naming head_dim: {r}")
    # K and V against MLA's one latent: the handshake is refused saying
    # which kinds, by name (the order inside a block may differ: the
    # agents convert it, tp_reshard)
    lay = layout() | {"tensors": 1}
    lay["bases"] = [b[:1] for b in lay["bases"]]
    r = register(D, lay)
    check(r is not None and r.get("op") == "registered",
          f"the decode engine registers again, MLA: {r}")
    check("kv_dtype" not in r,
          f"a register naming no kv_dtype hears none back: {r}")
    x = os.urandom(16)
    D.send({"op": "recv", "xfer": x, "peer": addrs["P"], "blocks": [1]})
    ev = D.event(x, 4000)
    check(ev is not None and ev["kind"] == "failed" and
          ("tensors 1 (MLA) != 2 (K and V)" in ev["reason"] or
           "tensors 2 (K and V) != 1 (MLA)" in ev["reason"]),
          f"MLA against K and V: failed, naming the kinds: {ev}")


def optional_fields(P, D, addrs, dst, src):
    """A malformed optional field fails the transfer naming it (it ran
    with the default before), and the peer named is told at once."""
    bad = [("recv", "skip_tokens", v) for v in (-1, "3", 1.5)]
    bad += [(op, "timeout_ms", v) for op in ("send", "recv")
            for v in (-5, "x", 2**64 - 1, 3600001)]
    bad += [("recv", "pull", 1)]
    for op, field, value in bad:
        x = os.urandom(16)
        me, other = (D, P) if op == "recv" else (P, D)
        if op == "recv":
            P.send({"op": "send", "xfer": x, "peer": addrs["D"],
                    "blocks": src})
        msg = {"op": op, "xfer": x, field: value,
               "peer": addrs["P" if op == "recv" else "D"],
               "blocks": dst if op == "recv" else src}
        me.send(msg)
        ev = me.event(x, 2000)
        check(ev is not None and ev["kind"] == "failed" and
              ev["status"] == PDX_EINVAL and ev["reason"].startswith(field),
              f"{op} with {field} {value!r}: failed naming it: {ev}")
        if op == "recv":
            ev = P.event(x, 2000)
            check(ev is not None and ev["kind"] == "failed",
                  f"... and the sender is told at once: {ev}")
    # 0 is the agent's default, as when absent
    x = os.urandom(16)
    D.send({"op": "recv", "xfer": x, "peer": addrs["P"], "blocks": dst,
            "timeout_ms": 0})
    P.send({"op": "send", "xfer": x, "peer": addrs["D"], "blocks": src,
            "timeout_ms": 0})
    for layer in range(LAYERS):
        P.send({"op": "layer_done", "layer": layer, "xfers": [x]})
    ev = D.event(x)
    check(ev is not None and ev["kind"] == "received",
          f"timeout_ms 0: the agent's own bound: {ev}")
    P.event(x)
    # naming this very agent as the peer: refused, saying so
    for e, op, me in ((D, "recv", "D"), (P, "send", "P")):
        x = os.urandom(16)
        e.send({"op": op, "xfer": x, "peer": addrs[me], "blocks": [1]})
        ev = e.event(x, 2000)
        check(ev is not None and ev["kind"] == "failed" and
              ev["status"] == PDX_EINVAL and "is this agent" in ev["reason"],
              f"a {op} naming its own agent: refused saying so: {ev}")


def shrunk_pool(rig, P, D, addrs, dst, src):
    """An engine that shrinks its pool under the agents (ftruncate) fails
    the transfer that touches it (EIO); no agent dies of SIGBUS (before,
    the one copying did, and every transfer it served with it)."""
    r = register(D)  # fields_named left it registered MLA
    check(r is not None and r.get("op") == "registered",
          f"the decode engine registers again, K and V: {r}")
    for shrinks, pull in ((D, False), (P, True)):
        x = os.urandom(16)
        D.send({"op": "recv", "xfer": x, "peer": addrs["P"], "blocks": dst,
                "pull": pull})
        P.send({"op": "send", "xfer": x, "peer": addrs["D"], "blocks": src})
        time.sleep(0.3)  # both announced, the want on its way
        os.truncate("/dev/shm/" + shrinks.shm.name, 4096)
        for layer in range(LAYERS):
            P.send({"op": "layer_done", "layer": layer, "xfers": [x]})
        ev = (P if shrinks is D else D).event(x)
        how = "pushed into a shrunk pool" if shrinks is D else \
            "pulled from a shrunk pool"
        check(ev is not None and ev["kind"] == "failed" and
              ev["status"] == PDX_EIO,
              f"a transfer {how}: failed, EIO, for the agent copying: {ev}")
        check(rig.agents_run(), f"... and every agent still runs ({how})")


def main():
    args = ("--handshake-timeout-ms", str(HANDSHAKE_MS),
            "--peer-timeout-ms", "10000")
    with Rig(sys.argv[1], "el", "PDU", args) as rig:
        P, D, U = rig.engines
        addrs = {}
        before_register(U)
        for side, e in zip("PD", (P, D)):
            r = e.register()
            check(r is not None and r.get("op") == "registered",
                  f"{side} engine registers: {r}")
            addrs[side] = r["peer"]
        src = random.sample(range(BLOCKS), 4)
        dst = random.sample(range(BLOCKS), 4)
        kv_dtype_said_back(D)
        reconnect(rig, D, P, addrs, dst, src)
        duplicate_id(P, D, addrs, dst, src)
        skip_all(P, D, addrs, dst, src)
        duplicate_blocks(P, D, addrs)
        nobody_there(D)
        optional_fields(P, D, addrs, dst, src)
        fields_named(P, D, addrs)
        shrunk_pool(rig, P, D, addrs, dst, src)
        check(rig.agents_run(), "every agent still runs")
    return exit_code()


if __name__ == "__main__":
    sys.exit(main())
