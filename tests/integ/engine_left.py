#!/usr/bin/python3
"""engine_left: engines whose connection closes right after their
register (an engine that died while starting, or gave up waiting for
its answer), ten times against one pdx-agent. None may stay registered:
after each, the agent counts no engine (pdx_agent_engine_registered 0)
and maps nothing of that engine's pool. A register left over from a
connection that had closed when the agent read it was registered, and
its close was never seen again: the dead engine's pool stayed mapped
until another engine registered (docs/protocol.md, "The engine's end").

    engine_left.py PATH-TO-pdx-agent

Exits 0 (pass), 1 (fail) or 77 (skip: pyzmq or msgpack missing).
"""
import sys
import time
import urllib.request

from pypeer import Rig, check, exit_code, layout, pack, zmq, Engine

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


def main():
    with Rig(sys.argv[1], "left", "A", metrics=True) as rig:
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
                with open(f"/proc/{pid}/maps") as f:
                    maps = f.read().count(e.shm.name)
                now = registered(url)
                if now == "0" and maps == 0:
                    break
                time.sleep(0.1)
            check(now == "0" and maps == 0,
                  f"try {i}: the engine gone after its register: registered "
                  f"{now}, its pool mapped {maps} times")
    return exit_code()


if __name__ == "__main__":
    sys.exit(main())
