#!/usr/bin/python3
"""open_send: a send that names no receiver (docs/protocol.md, "send"; what
a prefill side behind vLLM's proxies announces, docs/security.md), with
real pdx-agents: A sends, B and C receive.

Checked: the first agent to present the id claims it, by its want (B
receives every byte) or by a hold in its ping (A renews the lease for
it); a later claimant from another agent is refused ("transfer is not
for this agent") while the transfer lives, and after it ended; a want
that comes before the send is the claim; an open send nobody claimed
fails at its lease with why, nobody else is told, and a claimant too
late hears why; a recv must still name its peer.

    open_send.py PATH-TO-pdx-agent

Exits 0 (pass), 1 (fail) or 77 (skip: pyzmq or msgpack missing).
"""
import os
import random
import re
import sys
import time
import urllib.request

from pypeer import (BLOCKS, BLOCK_BYTES, LAYERS, TENSORS, Rig, check,
                    exit_code, same_blocks)

LEASE_MS = 2500  # room for a first handshake on a loaded machine


def metric(url, name):
    """One sample of an agent's /metrics, 0 when absent."""
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    m = re.search(r"^" + re.escape(name) + r" (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0


def wait_metric(url, name, at_least, ms):
    end = time.time() + ms / 1000
    while time.time() < end:
        if metric(url, name) >= at_least:
            return True
        time.sleep(0.05)
    return False


def all_layers(eng, xfer):
    for layer in range(LAYERS):
        eng.send({"op": "layer_done", "layer": layer, "xfers": [xfer]})


def main():
    with Rig(sys.argv[1], "open", "ABC",
             ["--lease-ms", str(LEASE_MS), "--heartbeat-ms", "100"],
             metrics=True) as rig:
        EA, EB, EC = rig.engines
        A, _, _ = rig.register()
        EA.shm.buf[:] = os.urandom(EA.shm.size)
        want = LAYERS * TENSORS * 4 * BLOCK_BYTES

        # claimed by a want: B gets every byte; C, asking after, is refused
        src, dst = random.sample(range(BLOCKS), 4), random.sample(range(BLOCKS), 4)
        x1 = os.urandom(16)
        EA.send({"op": "send", "xfer": x1, "blocks": src})
        EB.send({"op": "recv", "xfer": x1, "peer": A, "blocks": dst})
        all_layers(EA, x1)
        got_a, got_b = EA.event(x1), EB.event(x1)
        check(got_a is not None and got_a["kind"] == "sent",
              f"open send: the sender's event is sent: {got_a}")
        check(got_b is not None and got_b["kind"] == "received" and
              got_b["bytes"] == want, f"the claimant receives {want} bytes: {got_b}")
        check(same_blocks(EA.shm.buf, src, EB.shm.buf, dst),
              "every byte of every block arrived at the claimant")
        EC.send({"op": "recv", "xfer": x1, "peer": A, "blocks": dst})
        got_c = EC.event(x1)
        check(got_c is not None and got_c["kind"] == "failed" and
              "transfer is not for this agent" in got_c["reason"],
              f"a claim after the transfer ended is refused: {got_c}")

        # claimed by a hold (B's engine queued the request): A renews the
        # lease for B, refuses C's want while the transfer lives, and
        # sends to B once B's engine asks
        x2 = os.urandom(16)
        renewals = metric(rig.metrics[0], "pdx_agent_lease_renewals_total")
        EA.send({"op": "send", "xfer": x2, "blocks": src})
        EB.send({"op": "hold", "xfer": x2, "peer": A})
        check(wait_metric(rig.metrics[0], "pdx_agent_lease_renewals_total",
                          renewals + 1, 5000),
              "a hold claims the open send: the sender renews its lease")
        EC.send({"op": "recv", "xfer": x2, "peer": A, "blocks": dst})
        got_c = EC.event(x2)
        check(got_c is not None and got_c["kind"] == "failed" and
              "transfer is not for this agent" in got_c["reason"],
              f"a second claimant is refused: {got_c}")
        check(EA.n_events(x2) == 0, "the claimed send goes on at the sender")
        EB.shm.buf[:] = bytes(EB.shm.size)
        EB.send({"op": "recv", "xfer": x2, "peer": A, "blocks": dst})
        all_layers(EA, x2)
        got_a, got_b = EA.event(x2), EB.event(x2)
        check(got_a is not None and got_a["kind"] == "sent" and
              got_b is not None and got_b["kind"] == "received" and
              same_blocks(EA.shm.buf, src, EB.shm.buf, dst),
              f"the hold's claimant receives it: {got_a} {got_b}")

        # a want before the send: that agent claimed it
        x3 = os.urandom(16)
        EC.send({"op": "recv", "xfer": x3, "peer": A, "blocks": dst})
        time.sleep(0.2)  # either order must work; this tries want first
        EA.send({"op": "send", "xfer": x3, "blocks": src})
        all_layers(EA, x3)
        got_a, got_c = EA.event(x3), EC.event(x3)
        check(got_a is not None and got_a["kind"] == "sent" and
              got_c is not None and got_c["kind"] == "received" and
              same_blocks(EA.shm.buf, src, EC.shm.buf, dst),
              f"a want before the open send claims it: {got_a} {got_c}")

        # nobody claims it: failed at the lease, saying so
        x4 = os.urandom(16)
        t0 = time.time()
        EA.send({"op": "send", "xfer": x4, "peer": None, "blocks": src})
        all_layers(EA, x4)
        got_a = EA.event(x4, ms=LEASE_MS + 5000)
        took = time.time() - t0
        check(got_a is not None and got_a["kind"] == "failed" and
              "no agent claimed it" in got_a["reason"] and
              LEASE_MS / 1000 * 0.9 <= took,
              f"an unclaimed open send fails at its lease ({took:.2f} s): {got_a}")

        EB.pump(300)
        EC.pump(300)
        check(EB.n_events(x4) == 0 and EC.n_events(x4) == 0,
              "no other engine hears of the unclaimed send")
        # a claimant too late hears why at once
        EB.send({"op": "recv", "xfer": x4, "peer": A, "blocks": dst})
        got_b = EB.event(x4)
        check(got_b is not None and got_b["kind"] == "failed" and
              "no agent claimed it" in got_b["reason"],
              f"a claim after the lease is refused with why: {got_b}")

        # an abort presenting the id ends an unclaimed open send at once:
        # a decode request that left before asking for its KV (abort_at)
        x6 = os.urandom(16)
        t0 = time.time()
        EA.send({"op": "send", "xfer": x6, "blocks": src})
        all_layers(EA, x6)
        EB.send({"op": "abort", "xfer": x6, "peer": A})
        got_a = EA.event(x6, ms=LEASE_MS // 2)
        took = time.time() - t0
        check(got_a is not None and got_a["kind"] == "failed" and
              "abort" in got_a["reason"] and took < LEASE_MS / 1000 / 2,
              f"an abort from an agent that never claimed the open send "
              f"ends it at once ({took:.2f} s): {got_a}")

        # a recv must name whom it receives from
        x5 = os.urandom(16)
        EB.send({"op": "recv", "xfer": x5, "blocks": dst})
        got_b = EB.event(x5)
        check(got_b is not None and got_b["kind"] == "failed" and
              "peer" in got_b["reason"], f"a recv without a peer fails: {got_b}")
        check(rig.agents_run(), "the agents still run")
    return exit_code()


if __name__ == "__main__":
    sys.exit(main())
