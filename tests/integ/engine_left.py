#!/usr/bin/python3
"""engine_left: engines that leave at awkward moments (docs/protocol.md,
"The engine's end"), against two pdx-agents, A and B.

  - Ten engines whose connection closes right after their register (an
    engine that died while starting, or gave up waiting for its answer):
    none may stay registered at A (pdx_agent_engine_registered 0), and A
    maps nothing of their pools. A register left over from a connection
    that had closed when A read it was registered, and its close was
    never seen again: the dead engine's pool stayed mapped until another
    engine registered.
  - A's engine exits while A's hello to B is unanswered (B stopped): B,
    resumed, takes the hello and maps that engine's pool, and its
    hello_ack is refused by A, which has no engine now. A then tells B
    `gone`, and B lets go of the pool (it kept it until an engine
    registered at A again: A's `gone` at the engine's end went only to
    peers it had a handshake with).
  - A's engine exits while a receive of its waits for its sender's
    `stopped` (B stopped: it may still write into the pool), and a new
    engine registers and has a receive of its own wait so (from C,
    stopped too). Once B answers, A lets go of the old pool, C still
    stopped: it waited until no transfer at all was in use, the new
    engine's included, which under steady load could be never.
  - A's engine exits while B pulls from it by UCX get (the put lane,
    --data-path put), over shared memory and over TCP: A's UCX worker
    answers B's gets from A's memory, so A keeps it until B says its
    reads ended (B's "stopped", or its own abort). A unmapped the pool
    at once, and its worker's next answer read unmapped memory: A died
    of SIGSEGV. Over TCP B closed its endpoint to A at A's `gone`,
    which cut its gets short, and said "stopped" at once, while A's
    worker still had answers to them queued: A died of SIGSEGV (10 runs
    in 10). B now keeps that endpoint until its gets ended.
  - Over TCP (the put lane), A's engine exits mid-push to B and a new
    engine registers at A at once: B's next transfer from it arrives,
    byte-exact. B makes its endpoint to A anew at A's new instance, and
    A its own to B at B's answer; A kept its old one, whose far end B had
    closed, and the new engine's pushes timed out (4 tries in 5). A first
    fix that closed A's endpoints at the engine's end crashed A inside
    UCX's TCP transport (9 runs in 20; a reviewer's find). With the old
    engine's transfer pulled (new_engine_tcp(rig, pull=True)) likewise:
    the new engine's transfer failed in about 1 run in 50 (more on a
    busy host), its endpoints found dead by UCX ("timed out") right
    after the handshake, and so every transfer between A and B after:
    UCX 1.13 pairs two workers' endpoints by how many each side made to
    the other, and an agent made one at each handshake, so one made on
    one side only (a handshake the other refused) paired each side's
    next endpoint with a stale one of the other's, whose far end was
    closed. An agent now makes one UCX endpoint per peer worker and
    keeps it across handshakes until it fails or the peer is cut.
  - Over TCP (the put lane), A's engine registers and exits while B is
    stopped: B, resumed, takes A's hello (an endpoint) and A refuses
    its hello_ack. B's next transfers from A's next engines arrive. A
    endpoint made by B alone shifted UCX's pairing: they hung ("timed
    out ... waiting for the sender") or failed (2 runs in 2 of 3 tries).
  - Over TCP (the put lane), B's engine exits mid-push from A, five
    times: B lives on and lets go of each pool. A said "stopped" once
    its puts ended here, while some were still on their way (a put over
    TCP is a message B's worker applies when it reads it): B released
    the pool at that word and wrote the rest into unmapped memory
    (SIGSEGV in ucp_put_handler, 6 runs in 10). A flushes first.

    engine_left.py PATH-TO-pdx-agent

Exits 0 (pass), 1 (fail) or 77 (skip: pyzmq or msgpack missing).
"""
import sys
import time
import urllib.request

import os
import signal

from pypeer import (BLOCK_BYTES, LAYERS, Engine, Rig, block_at, check,
                    exit_code, layout, zmq)

TRIES = 10


def registered(url):
    """The agent's pdx_agent_engine_registered (None: no answer yet: it
    is starting)."""
    try:
        text = urllib.request.urlopen(url, timeout=5).read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("pdx_agent_engine_registered"):
            return line.split()[-1]
    return None


def maps_of(pid, name):
    with open(f"/proc/{pid}/maps") as f:
        return f.read().count(name)


def hello_unanswered(rig):
    EA, EB = rig.engines
    ra, rb = EA.register(), EB.register()
    check(ra and ra.get("op") == "registered" and rb and
          rb.get("op") == "registered", f"A's and B's engines register: {ra}, {rb}")
    b = rig.agents[1].pid
    os.kill(b, signal.SIGSTOP)  # B slow to answer A's hello
    try:
        EA.send({"op": "send", "xfer": os.urandom(16), "peer": rb["peer"],
                 "blocks": [0, 1]})
        time.sleep(0.5)  # A said hello to B
        EA.sock.close(linger=0)  # and its engine exits
        time.sleep(0.5)
    finally:
        os.kill(b, signal.SIGCONT)
    time.sleep(1)  # B takes the hello, maps the pool, answers
    deadline = time.time() + 3
    while maps_of(b, EA.shm.name) and time.time() < deadline:
        time.sleep(0.1)
    check(maps_of(b, EA.shm.name) == 0,
          "B, its hello_ack refused by A (no engine), maps nothing of A's "
          f"dead engine's pool 3 s on ({maps_of(b, EA.shm.name)} maps)")


def ready_peers(url):
    """The agent's pdx_agent_peers{state="ready"} (0: none, or no answer)."""
    try:
        text = urllib.request.urlopen(url, timeout=5).read().decode()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith('pdx_agent_peers{state="ready"}'):
            return int(float(line.split()[-1]))
    return 0


def wait_want(engine, xfer, peer, url):
    """engine asks for xfer from peer's agent, which has no send for it:
    the want stays unanswered. Returns once the agent at url (the
    engine's) holds one more handshake: its want goes out with the
    hello_ack (a sleep of 0.5 s was not enough for a peer slow to answer
    the hello: no want had gone out, and the agent rightly kept nothing)."""
    before = ready_peers(url)
    engine.send({"op": "recv", "xfer": xfer, "peer": peer, "blocks": [0, 1]})
    deadline = time.time() + 10
    while ready_peers(url) <= before and time.time() < deadline:
        time.sleep(0.05)
    check(ready_peers(url) > before, f"the handshake with {peer} for the want")
    time.sleep(0.2)  # the want went out


def old_pool_alone(rig):
    EA, EB, EC = rig.engines
    a, b, c = (x.pid for x in rig.agents)
    ra, rb, rc = EA.register(), EB.register(), EC.register()
    check(all(r and r.get("op") == "registered" for r in (ra, rb, rc)),
          f"A's, B's and C's engines register: {ra}, {rb}, {rc}")
    stopped = []
    try:
        wait_want(EA, os.urandom(16), rb["peer"], rig.metrics[0])
        os.kill(b, signal.SIGSTOP)
        stopped.append(b)
        EA.sock.close(linger=0)  # A's engine exits: A awaits B's stopped
        time.sleep(0.3)
        e2 = rig.adopt(Engine(rig.ctx, f"pdx-left-{a}-new", f"ipc://{rig.tmp}/A.engine"))
        r2 = e2.register()
        check(r2 and r2.get("op") == "registered", f"a new engine registers at A: {r2}")
        check(maps_of(a, EA.shm.name) > 0,
              "A keeps the old pool while B may write into it")
        x2 = os.urandom(16)
        wait_want(e2, x2, rc["peer"], rig.metrics[0])
        os.kill(c, signal.SIGSTOP)
        stopped.append(c)
        e2.send({"op": "abort", "xfer": x2})  # awaits C's stopped
        time.sleep(0.3)
        os.kill(b, signal.SIGCONT)
        stopped.remove(b)
        deadline = time.time() + 2
        while maps_of(a, EA.shm.name) and time.time() < deadline:
            time.sleep(0.1)
        check(maps_of(a, EA.shm.name) == 0,
              "A lets go of the old engine's pool once B said stopped, the "
              "new engine's receive still waiting for C "
              f"({maps_of(a, EA.shm.name)} maps 2 s on)")
        check(maps_of(a, e2.shm.name) > 0, "A keeps the new engine's pool")
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)


PULL_TRIES = 5
P_LAYERS, P_TENSORS, P_BLOCKS, P_BT, P_HEADS, P_DIM = 32, 2, 128, 16, 4, 64
P_BB = P_BT * P_HEADS * P_DIM * 2
P_SIZE = P_LAYERS * P_TENSORS * P_BLOCKS * P_BB  # a pull of it takes a while


def pull_layout():
    return {
        "layers": P_LAYERS, "tensors": P_TENSORS, "blocks": P_BLOCKS,
        "block_tokens": P_BT, "kv_heads": P_HEADS, "head_dim": P_DIM,
        "dtype_bytes": 2, "order": "NHD",
        "bases": [[[0, (P_TENSORS * l + t) * P_BLOCKS * P_BB]
                   for t in range(P_TENSORS)] for l in range(P_LAYERS)],
        "strides": [P_BB] * P_LAYERS,
    }


def big_engine(rig, side, tag, fill=None):
    """A stand-in engine at SIDE's agent with the big pool (filled with
    the byte FILL), registered with pull_layout(): (engine, its answer),
    the answer None when it did not register."""
    e = rig.adopt(Engine(rig.ctx, f"pdx-left-{rig.agents[0].pid}-{tag}",
                         f"ipc://{rig.tmp}/{side}.engine", P_SIZE))
    if fill is not None:
        e.shm.buf[:] = fill * P_SIZE
    r = e.register(pull_layout())
    ok = r and r.get("op") == "registered"
    check(ok, f"{tag}: {side}'s engine registers: {r}")
    return e, (r if ok else None)


def landing(e):
    """Waits (10 s at most) until bytes landed in e's first block;
    whether they did."""
    deadline = time.time() + 10
    while not any(e.shm.buf[:P_BB]) and time.time() < deadline:
        time.sleep(0.0005)
    return any(e.shm.buf[:P_BB])


def lets_go(agent, e, what, settle=0):
    """The agent unmaps e's pool (its engine gone) within 5 s, and lives
    on SETTLE s more; whether it lives."""
    deadline = time.time() + 5
    while agent.poll() is None and maps_of(agent.pid, e.shm.name) and \
            time.time() < deadline:
        time.sleep(0.05)
    time.sleep(settle)
    check(agent.poll() is None, f"{what}: the agent lives on ({agent.poll()})")
    if agent.poll() is not None:
        return False
    check(maps_of(agent.pid, e.shm.name) == 0,
          f"{what}: the agent lets go of its dead engine's pool "
          f"({maps_of(agent.pid, e.shm.name)} maps 5 s on)")
    return True


def pull_sender_gone(rig):
    a = rig.agents[0]
    eb, rb = big_engine(rig, "B", "pb")
    blocks = list(range(0, P_BLOCKS, 2))  # a get each: a read that lasts
    for i in range(PULL_TRIES):
        ea, ra = big_engine(rig, "A", f"pa{i}", b"\x5a")
        eb.shm.buf[:P_BB] = bytes(P_BB)
        x = os.urandom(16)
        eb.send({"op": "recv", "xfer": x, "peer": ra["peer"], "blocks": blocks,
                 "pull": True})
        ea.send({"op": "send", "xfer": x, "peer": rb["peer"], "blocks": blocks})
        for layer in range(P_LAYERS):
            ea.send({"op": "layer_done", "layer": layer, "xfers": [x]})
        began = landing(eb)  # B's reads began
        ea.sock.close(linger=0)  # A's engine exits mid-pull
        ev = eb.event(x, 10000)
        check(began and ev is not None,
              f"try {i}: B's reads began ({began}), then its engine hears "
              f"of the pull: {ev and ev.get('kind')} {ev and ev.get('reason')}")
        if not lets_go(a, ea, f"try {i}: A"):
            return


def receiver_gone_tcp(rig):
    b = rig.agents[1]
    ea, ra = big_engine(rig, "A", "ra", b"\x5a")
    blocks = list(range(0, P_BLOCKS, 2))
    for i in range(PULL_TRIES):
        eb, rb = big_engine(rig, "B", f"rb{i}")
        x = os.urandom(16)
        eb.send({"op": "recv", "xfer": x, "peer": ra["peer"], "blocks": blocks})
        ea.send({"op": "send", "xfer": x, "peer": rb["peer"], "blocks": blocks})
        for layer in range(P_LAYERS):
            ea.send({"op": "layer_done", "layer": layer, "xfers": [x]})
        began = landing(eb)  # A's puts began to land
        eb.sock.close(linger=0)  # B's engine exits mid-push
        ev = ea.event(x, 10000)
        check(began and ev is not None,
              f"try {i}: A's puts began ({began}), then its engine hears "
              f"of the push: {ev and ev.get('kind')} {ev and ev.get('reason')}")
        # (what was still on its way is applied after the unmapping)
        if not lets_go(b, eb, f"try {i}: B", settle=0.2):
            return


def new_engine_tcp(rig, pull=False):
    a = rig.agents[0]
    eb, rb = big_engine(rig, "B", "tb")
    for i in range(3):
        old, ra = big_engine(rig, "A", f"to{i}", b"\x5a")
        eb.shm.buf[:P_BB] = bytes(P_BB)
        x = os.urandom(16)
        eb.send({"op": "recv", "xfer": x, "peer": ra["peer"],
                 "blocks": list(range(0, P_BLOCKS, 2)), "pull": pull})
        old.send({"op": "send", "xfer": x, "peer": rb["peer"],
                  "blocks": list(range(0, P_BLOCKS, 2))})
        for layer in range(P_LAYERS):
            old.send({"op": "layer_done", "layer": layer, "xfers": [x]})
        landing(eb)  # until the bytes began to move
        old.sock.close(linger=0)  # mid-transfer
        new, rn = big_engine(rig, "A", f"tn{i}", b"\xa5")
        check(eb.event(x, 10000) is not None, f"try {i}: B hears of the old one")
        if rn is None:
            check(a.poll() is None, f"try {i}: A lives ({a.poll()})")
            return
        y = os.urandom(16)
        eb.send({"op": "recv", "xfer": y, "peer": rn["peer"], "blocks": [1, 3]})
        new.send({"op": "send", "xfer": y, "peer": rb["peer"], "blocks": [5, 7]})
        for layer in range(P_LAYERS):
            new.send({"op": "layer_done", "layer": layer, "xfers": [y]})
        ev = eb.event(y, 15000)
        check(ev is not None and ev.get("kind") == "received" and
              bytes(eb.shm.buf[P_BB:2 * P_BB]) == b"\xa5" * P_BB,
              f"try {i}: B's transfer from A's new engine arrives, its "
              f"bytes: {ev and ev.get('kind')} {ev and ev.get('reason')}")
        check(a.poll() is None, f"try {i}: A lives ({a.poll()})")
        if a.poll() is not None:
            return
        new.sock.close(linger=0)
        time.sleep(0.3)


def unanswered_tcp(rig):
    EA, EB = rig.engines
    a, b = rig.agents
    ra, rb = EA.register(), EB.register()
    check(ra and ra.get("op") == "registered" and rb and
          rb.get("op") == "registered", f"A's and B's engines register: {ra}, {rb}")
    x = os.urandom(16)
    EB.send({"op": "recv", "xfer": x, "peer": ra["peer"], "blocks": [0]})
    EA.send({"op": "send", "xfer": x, "peer": rb["peer"], "blocks": [0]})
    for layer in range(LAYERS):
        EA.send({"op": "layer_done", "layer": layer, "xfers": [x]})
    ev = EB.event(x, 5000)
    check(ev is not None and ev.get("kind") == "received",
          f"a first transfer: {ev and ev.get('kind')} {ev and ev.get('reason')}")
    EA.sock.close(linger=0)
    time.sleep(0.5)
    os.kill(b.pid, signal.SIGSTOP)  # A's hello to B waits unanswered
    try:
        e = rig.adopt(Engine(rig.ctx, f"pdx-left-{a.pid}-u", f"ipc://{rig.tmp}/A.engine"))
        r = e.register()
        check(r and r.get("op") == "registered", f"A's second engine registers: {r}")
        time.sleep(0.3)
        e.sock.close(linger=0)  # and it exits before B answers
        time.sleep(0.3)
    finally:
        os.kill(b.pid, signal.SIGCONT)
    time.sleep(1)  # B makes its endpoint, A refuses its hello_ack
    for i in range(3):
        e = rig.adopt(Engine(rig.ctx, f"pdx-left-{a.pid}-u{i}", f"ipc://{rig.tmp}/A.engine"))
        e.shm.buf[:] = bytes([0x30 + i]) * e.shm.size
        r = e.register()
        check(r and r.get("op") == "registered", f"try {i}: A's next engine registers: {r}")
        if not r or r.get("op") != "registered":
            return
        y = os.urandom(16)
        EB.send({"op": "recv", "xfer": y, "peer": r["peer"], "blocks": [1]})
        e.send({"op": "send", "xfer": y, "peer": rb["peer"], "blocks": [5]})
        for layer in range(LAYERS):
            e.send({"op": "layer_done", "layer": layer, "xfers": [y]})
        ev = EB.event(y, 12000)
        check(ev is not None and ev.get("kind") == "received" and
              block_at(EB.shm.buf, 0, 0, 1) == bytes([0x30 + i]) * BLOCK_BYTES,
              f"try {i}: B's transfer from A's next engine arrives, its "
              f"bytes: {ev and ev.get('kind')} {ev and ev.get('reason')}")
        e.sock.close(linger=0)
        time.sleep(0.3)


def main():
    for pull in (False, True):
        with Rig(sys.argv[1], "left", "AB", agent_args=("--data-path", "put"),
                 tls="tcp,self") as rig:
            print(f"# new_engine_tcp, pull={pull}", flush=True)
            new_engine_tcp(rig, pull)
    with Rig(sys.argv[1], "left", "AB", agent_args=("--data-path", "put"),
             tls="tcp,self") as rig:
        print("# unanswered_tcp", flush=True)
        unanswered_tcp(rig)
    for tls in ("sm,self", "tcp,self"):
        with Rig(sys.argv[1], "left", "AB", agent_args=("--data-path", "put"),
                 tls=tls) as rig:
            print(f"# pull_sender_gone, UCX_TLS={tls}", flush=True)
            pull_sender_gone(rig)
    with Rig(sys.argv[1], "left", "AB", agent_args=("--data-path", "put"),
             tls="tcp,self") as rig:
        receiver_gone_tcp(rig)
    with Rig(sys.argv[1], "left", "ABC", metrics=True) as rig:
        old_pool_alone(rig)
    with Rig(sys.argv[1], "left", "AB", metrics=True) as rig:
        url, pid = rig.metrics[0], rig.agents[0].pid
        addr = f"ipc://{rig.tmp}/A.engine"
        deadline = time.time() + 10
        while registered(url) is None and time.time() < deadline:
            time.sleep(0.1)
        for i in range(TRIES):
            e = rig.adopt(Engine(rig.ctx, f"pdx-left-{pid}-{i}", addr))
            e.sock.setsockopt(zmq.LINGER, 2000)  # the register goes out
            e.send({"op": "register", "v": 1, "layout": layout(),
                    "regions": [{"type": "shm", "name": "/" + e.shm.name,
                                 "size": e.shm.size}]})
            e.sock.close()  # and the engine is gone
            deadline = time.time() + 3
            while time.time() < deadline:
                maps = maps_of(pid, e.shm.name)
                now = registered(url)
                if now == "0" and maps == 0:
                    break
                time.sleep(0.1)
            check(now == "0" and maps == 0,
                  f"try {i}: the engine gone after its register: registered "
                  f"{now}, its pool mapped {maps} times")
        hello_unanswered(rig)
    return exit_code()


if __name__ == "__main__":
    sys.exit(main())
