#!/usr/bin/python3
"""peer_restart: the first transfer to a prefill agent (P) SIGKILLed and
started again at the same address within two heartbeat periods of the
last word the decode agent (D) had from it (docs/reliability.md, "peer
restarted"; docs/protocol.md, "Handshake cache").

D still holds the dead agent's handshake and sends its want on it; the
new agent's hello crosses that want. Before, D failed the transfer as
begun with the old instance ("peer restarted"): nothing of it had moved,
and the client got an error for a request that could have been served.
Made certain here: P's new agent is stopped (SIGSTOP) while D's engine
announces the receive, so D's want goes out on the old handshake and
waits at P's address; P's engine announces the send, and P runs again.
Whichever P reads first (its engine's send, whose hello goes to D, or
D's want, refused for want of a handshake), the want went to the old
instance's handshake: failed before in every order, served now.

Also checked: a transfer whose want the old agent took (it may have
written blocks) still fails "peer restarted" at once, not at its
timeout; so does one D's engine holds queued (its KV went with the old
agent: it waited for the hold's bound, and without an event for a held
transfer its request learned only once admitted); a want that crossed the restart for a transfer the new agent's
engine never announces fails at once too (not held for an
announcement); a transfer afterwards works, byte for byte.

The heartbeat is 5 s here, so that D's quiet bound (two periods) is not
reached while the test runs, whatever the load: the window is the bug's.

    peer_restart.py PATH-TO-pdx-agent

Exits 0 (pass), 1 (fail) or 77 (skip: pyzmq or msgpack missing).
"""
import contextlib
import os
import random
import signal
import subprocess
import sys
import time

from pypeer import (BLOCKS, BLOCK_BYTES, LAYERS, TENSORS, Rig, check,
                    exit_code, same_blocks)

XFER_TMO_S = 20  # far from every bound checked here


def main():
    args = ["--heartbeat-ms", "5000", "--peer-timeout-ms", "30000",
            "--xfer-timeout-ms", str(XFER_TMO_S * 1000)]
    with Rig(sys.argv[1], "restart", "PD", args) as rig:
        P, D = rig.engines
        addrs = dict(zip("PD", rig.register()))
        env = dict(os.environ, UCX_TLS="sm,self", UCX_WARN_UNUSED_ENV_VARS="n")

        def fill():
            src = random.sample(range(BLOCKS), 5)
            dst = random.sample(range(BLOCKS), 5)
            P.shm.buf[:] = os.urandom(P.shm.size)
            return src, dst, os.urandom(16)

        def send(x, src, layers=range(LAYERS)):
            P.send({"op": "send", "xfer": x, "peer": addrs["D"], "blocks": src})
            for layer in layers:
                P.send({"op": "layer_done", "layer": layer, "xfers": [x]})

        def recv(x, dst):
            D.send({"op": "recv", "xfer": x, "peer": addrs["P"], "blocks": dst})

        def served(x, src, dst, what):
            gd, gp = D.event(x, 10000), P.event(x, 10000)
            want = LAYERS * TENSORS * len(src) * BLOCK_BYTES
            check(gd is not None and gd["kind"] == "received" and
                  gd["bytes"] == want and gp is not None and
                  gp["kind"] == "sent",
                  f"{what}: received and sent: "
                  f"{gd and (gd['kind'], gd['reason'])} "
                  f"{gp and (gp['kind'], gp['reason'])}")
            check(same_blocks(P.shm.buf, src, D.shm.buf, dst),
                  f"{what}: every byte of every block arrived")

        def restart():
            """P's agent SIGKILLed and started again at its address, its
            engine registered again."""
            old = rig.agents[0]
            old.kill()
            old.wait()
            rig.agents[0] = subprocess.Popen(old.args, env=env,
                                             stdout=subprocess.DEVNULL)
            reply = P.register()
            check(reply is not None and reply.get("op") == "registered" and
                  reply["peer"] == addrs["P"],
                  f"P's agent restarted at {addrs['P']}: {reply}")

        @contextlib.contextmanager
        def p_stopped():
            """P's agent stopped (SIGSTOP) meanwhile: what is sent to it
            waits at its address."""
            os.kill(rig.agents[0].pid, signal.SIGSTOP)
            try:
                yield
            finally:
                os.kill(rig.agents[0].pid, signal.SIGCONT)

        src, dst, x = fill()
        recv(x, dst)
        send(x, src)
        served(x, src, dst, "a transfer before the kill")

        # 1. the want on the dead agent's handshake, the new one's hello
        # crossing it: served
        restart()
        with p_stopped():
            src, dst, x = fill()
            recv(x, dst)
            time.sleep(1.0)  # D's want is out, waiting at P's address
            send(x, src)
            time.sleep(0.2)
        served(x, src, dst, "the first transfer after the restart, its want "
               "sent on the old handshake")

        # 2. a want the old agent took (its blocks perhaps written): it
        # fails "peer restarted" as soon as D meets the new agent (here
        # by the hello of P's next send), long before its timeout
        src, dst, x = fill()
        recv(x, dst)
        send(x, src, layers=[0])
        time.sleep(0.5)
        restart()
        t0 = time.time()
        src2, dst2, x2 = fill()
        send(x2, src2)
        gd = D.event(x, 10000)
        check(gd is not None and gd["kind"] == "failed" and
              "peer restarted" in gd["reason"] and
              time.time() - t0 < XFER_TMO_S / 2,
              f"a transfer the old agent took fails at the restart, "
              f"{time.time() - t0:.1f} s: {gd and gd['reason']}")
        recv(x2, dst2)
        served(x2, src2, dst2, "the next transfer")

        # 3. a want that crossed the restart for a transfer P's new engine
        # never announces: refused at once, not held for its announcement
        restart()
        with p_stopped():
            src, dst, x = fill()
            recv(x, dst)
            time.sleep(1.0)
        t0 = time.time()
        gd = D.event(x, 10000)
        check(gd is not None and gd["kind"] == "failed" and
              "restarted" in gd["reason"] and
              time.time() - t0 < XFER_TMO_S / 2,
              f"a transfer the new agent does not know fails at once, "
              f"{time.time() - t0:.1f} s: {gd and gd['reason']}")

        # 4. a transfer D's engine holds (its request queued, no recv
        # yet) when P's agent restarts: the KV P kept went with it, and
        # D's engine hears so as soon as D meets the new agent (by the
        # hello of P's next send), not at the hold's bound
        src, dst, x = fill()
        D.send({"op": "hold", "xfer": x, "peer": addrs["P"]})
        send(x, src)
        time.sleep(0.5)
        restart()
        t0 = time.time()
        src2, dst2, x2 = fill()
        send(x2, src2)
        gd = D.event(x, 10000)
        check(gd is not None and gd["kind"] == "failed" and
              "restarted" in gd["reason"] and
              time.time() - t0 < XFER_TMO_S / 2,
              f"a held transfer fails at the restart, "
              f"{time.time() - t0:.1f} s: {gd and gd['reason']}")
        recv(x2, dst2)
        served(x2, src2, dst2, "the next transfer")

        src, dst, x = fill()
        recv(x, dst)
        send(x, src)
        served(x, src, dst, "a transfer afterwards")
        check(rig.agents_run(), "both agents still run")
    return exit_code()


if __name__ == "__main__":
    sys.exit(main())
