#!/usr/bin/python3
"""one_sided: two pdx-agents configured differently, as a new user
deploying by hand across hosts may leave them.

  - CURVE on one agent only (docs/security.md): A runs with --curve-key
    and --curve-peers, B without. ZeroMQ drops every connection between
    them without a word to either, so each transfer from A to B fails at
    B's handshake bound (--handshake-timeout-ms, 1.5 s here), saying "no
    answer to our hello ... without CURVE as this one?". Each one:
    before, only the first waited the bound; the hellos after it could
    not be queued (ZeroMQ had no connection to put them on), and the
    transfers that waited on them failed within milliseconds, still
    saying no answer had come in the whole bound.
  - UCX_TLS differs (tcp on A, sm,self on B): UCX finds no transport of
    one that reaches the other's, and the transfer fails at once saying
    to compare UCX_TLS and UCX_NET_DEVICES (it said only "peer
    unreachable", and "refused").

  - A loopback --advertise (the one-host example copied to a host) and
    a peer on another host: the transfer fails blaming this agent's
    --advertise, not the peer.

    one_sided.py PATH-TO-pdx-agent

Exits 0 (pass), 1 (fail) or 77 (skip: pyzmq or msgpack missing).
"""
import os
import subprocess
import sys
import tempfile
import time

from pypeer import LAYERS, Rig, check, exit_code

BOUND_S = 1.5


def transfer(rig, peer, wait_ms):
    """One transfer from A to B: B's event, its reason, how long it took."""
    A, B = rig.engines
    x = os.urandom(16)
    t0 = time.monotonic()
    B.send({"op": "recv", "xfer": x, "peer": peer["A"], "blocks": [1]})
    A.send({"op": "send", "xfer": x, "peer": peer["B"], "blocks": [2]})
    for layer in range(LAYERS):
        A.send({"op": "layer_done", "layer": layer, "xfers": [x]})
    ev = B.event(x, wait_ms)
    took = time.monotonic() - t0
    A.event(x, wait_ms)  # A's side ends too
    return ev, ev and ev.get("reason") or "", took


def curve_one_side(agent):
    tmp = tempfile.mkdtemp(prefix="pdx-curve1-")
    key, peers = os.path.join(tmp, "a.key"), os.path.join(tmp, "peers")
    subprocess.run([agent, "--curve-keygen", key], check=True,
                   stdout=subprocess.DEVNULL)
    open(peers, "w").close()  # nobody: B has no key anyway
    args = ("--handshake-timeout-ms", str(int(BOUND_S * 1000)))
    with Rig(agent, "curve1", "AB", agent_args=args,
             side_args={"A": ("--curve-key", key, "--curve-peers", peers)}) as rig:
        peer = dict(zip("AB", rig.register()))
        for i in range(3):
            ev, why, took = transfer(rig, peer, int(BOUND_S * 4000))
            check(ev is not None and ev.get("kind") == "failed" and
                  "no answer to our hello" in why and
                  "without CURVE as this one" in why and
                  took >= 0.8 * BOUND_S,
                  f"CURVE on A only: transfer {i} fails at the bound, "
                  f"after {took:.2f} s (bound {BOUND_S} s): {why}")
    for f in (key, peers):
        os.unlink(f)
    os.rmdir(tmp)


def tls_differ(agent):
    with Rig(agent, "tls", "AB", tls={"A": "tcp", "B": "sm,self"}) as rig:
        peer = dict(zip("AB", rig.register()))
        ev, why, took = transfer(rig, peer, 5000)
        check(ev is not None and ev.get("kind") == "failed" and
              "UCX_TLS" in why and took < 2,
              f"UCX_TLS tcp on A, sm,self on B: the transfer fails at once "
              f"({took:.2f} s), saying to compare them: {why}")


def loopback_advertised(agent):
    """B's agent advertises a loopback address (the one-host example
    copied to a host of a deployment) and receives from a peer elsewhere
    (an address of no interface here): the peer's answer to B's hello
    goes to the peer's own loopback. B's transfer fails at the bound
    blaming B's --advertise (EIO, -201), not the peer (EPEER: a proxy
    opened the healthy prefill's breaker)."""
    args = ("--handshake-timeout-ms", str(int(BOUND_S * 1000)))
    with Rig(agent, "loop", "B", agent_args=args) as rig:
        rig.register()
        B = rig.engines[0]
        x = os.urandom(16)
        B.send({"op": "recv", "xfer": x, "peer": "tcp://192.0.2.1:7100",
                "blocks": [1]})
        ev = B.event(x, int(BOUND_S * 4000))
        why = ev and ev.get("reason") or ""
        check(ev is not None and ev.get("kind") == "failed" and
              ev.get("status") == -201 and
              "advertises tcp://127.0.0.1:" in why and
              "a loopback address" in why,
              f"loopback advertised, a peer elsewhere: fails blaming this "
              f"agent's --advertise: {ev}")


def main():
    curve_one_side(sys.argv[1])
    tls_differ(sys.argv[1])
    loopback_advertised(sys.argv[1])
    return exit_code()


if __name__ == "__main__":
    sys.exit(main())
