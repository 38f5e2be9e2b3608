"""pypeer: what the Python integration tests (python_engine.py,
late_messages.py) share. Written from docs/protocol.md with pyzmq and
msgpack only, no pdx code: real pdx-agents started on loopback, each with
an engine whose KV pool lives in POSIX shared memory and that talks to
its agent over a DEALER socket.

Importing it exits 77 (a skip) when pyzmq or msgpack is missing.
"""
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

try:
    import msgpack
    import zmq
    from multiprocessing import shared_memory
except ImportError as e:
    print(f"# skip: {e}")
    sys.exit(77)

LAYERS, TENSORS, BLOCKS = 4, 2, 64
BLOCK_TOKENS, KV_HEADS, HEAD_DIM, DTYPE = 4, 2, 16, 2
BLOCK_BYTES = BLOCK_TOKENS * KV_HEADS * HEAD_DIM * DTYPE
failures = 0


def check(ok, what):
    global failures
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    failures += 0 if ok else 1


def exit_code():
    """0 when every check passed, else 1."""
    return 1 if failures else 0


def free_ports(n):
    """n distinct free loopback ports below the kernel's ephemeral range
    (scripts/free-ports says why)."""
    return [int(p) for p in subprocess.check_output([
        sys.executable, os.path.join(os.path.dirname(os.path.abspath(
            __file__)), "..", "..", "scripts", "free-ports"),
        str(n)]).split()]


def free_port():
    return free_ports(1)[0]


def layout():
    """Layer-major: K then V of each layer, one region."""
    return {
        "layers": LAYERS, "tensors": TENSORS, "blocks": BLOCKS,
        "block_tokens": BLOCK_TOKENS, "kv_heads": KV_HEADS,
        "head_dim": HEAD_DIM, "dtype_bytes": DTYPE, "order": "NHD",
        "bases": [[[0, (TENSORS * l + t) * BLOCKS * BLOCK_BYTES]
                   for t in range(TENSORS)] for l in range(LAYERS)],
        "strides": [BLOCK_BYTES] * LAYERS,
    }


def block_at(buf, layer, tensor, block):
    off = (TENSORS * layer + tensor) * BLOCKS * BLOCK_BYTES + block * BLOCK_BYTES
    return bytes(buf[off:off + BLOCK_BYTES])


def same_blocks(src_buf, src, dst_buf, dst):
    """True when blocks src of src_buf equal blocks dst of dst_buf, in
    every layer and tensor."""
    return all(block_at(src_buf, l, t, s) == block_at(dst_buf, l, t, d)
               for l in range(LAYERS) for t in range(TENSORS)
               for s, d in zip(src, dst))


def pack(m):
    return msgpack.packb(m, use_bin_type=True)


def unpack(frame):
    return msgpack.unpackb(frame, raw=False)


class Engine:
    """An engine: a KV pool in shared memory, a DEALER to its agent; every
    event it gets is kept, by transfer."""

    def __init__(self, ctx, name, agent_addr, size=None):
        """size: the pool's bytes, by default layout()'s."""
        self.shm = shared_memory.SharedMemory(
            create=True, size=size or LAYERS * TENSORS * BLOCKS * BLOCK_BYTES,
            name=name)
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(agent_addr)
        self.events = {}

    lane = None  # the direct lane, once taken (take_lane)
    lane_in = b""

    def send(self, msg):
        if self.lane:
            body = pack(msg)
            self.lane.sendall(len(body).to_bytes(4, "big") + body)
        else:
            self.sock.send(pack(msg))

    def lane_frame(self):
        """A whole frame off the lane's bytes read so far, or None."""
        if len(self.lane_in) < 4:
            return None
        n = int.from_bytes(self.lane_in[:4], "big")
        if len(self.lane_in) < 4 + n:
            return None
        body, self.lane_in = self.lane_in[4:4 + n], self.lane_in[4 + n:]
        return unpack(body)

    def lane_drop(self):
        """The lane ends: what follows goes on ZeroMQ."""
        self.lane.close()
        self.lane, self.lane_in = None, b""

    def recv(self, timeout_ms):
        """The next message within timeout_ms, or None: off the lane once
        taken, read to its end before ZeroMQ (where the agent sends once
        the lane ended, and to other connections)."""
        end = time.time() + timeout_ms / 1000
        while True:
            if self.lane:
                m = self.lane_frame()
                if m is not None:
                    return m
            poller = zmq.Poller()
            poller.register(self.sock, zmq.POLLIN)
            if self.lane:
                poller.register(self.lane, zmq.POLLIN)
            left = max(0, int((end - time.time()) * 1000))
            ready = dict(poller.poll(left))
            if self.lane and self.lane.fileno() in ready:
                got = self.lane.recv(1 << 20)
                if not got:
                    self.lane_drop()
                self.lane_in += got
                continue
            if self.sock in ready:
                return unpack(self.sock.recv())
            if not ready and time.time() >= end:
                return None

    def take_lane(self, answer):
        """docs/protocol.md, "The direct lane": connects to what the
        "registered" answer offered, says its token, waits for the agent's
        marker on ZeroMQ, sends ours there, and from then on sends and
        reads on the lane. The lane's socket, or None when not offered."""
        if "direct" not in answer:
            return None
        lane = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        lane.connect("\0" + answer["direct"])
        hello = pack({"op": "direct", "token": answer["direct_token"]})
        lane.sendall(len(hello).to_bytes(4, "big") + hello)
        end = time.time() + 5
        while True:  # what comes on ZeroMQ before the marker is kept
            if not self.sock.poll(max(0, int((end - time.time()) * 1000))):
                raise TimeoutError("no direct marker from the agent")
            m = unpack(self.sock.recv())
            if m == {"op": "direct"}:
                break
            if m.get("op") == "event":
                self.events.setdefault(m["xfer"], []).append(m)
        self.sock.send(pack({"op": "direct"}))
        self.lane = lane
        return lane

    def register(self, lay=None):
        """Registers (again each second until the agent answers, for 10 s)
        with lay, by default layout(); the agent's answer or None."""
        deadline = time.time() + 10
        while time.time() < deadline:
            self.send({"op": "register", "v": 1, "layout": lay or layout(),
                       "regions": [{"type": "shm", "name": "/" + self.shm.name,
                                    "size": self.shm.size}]})
            reply = self.recv(1000)
            if reply is not None:
                return reply
        return None

    def pump(self, ms):
        """Reads events for ms milliseconds."""
        end = time.time() + ms / 1000
        while True:
            left = int((end - time.time()) * 1000)
            m = self.recv(left) if left > 0 else None
            if m is None:
                return
            if m.get("op") == "event":
                self.events.setdefault(m["xfer"], []).append(m)

    def event(self, xfer, ms=5000):
        """The first event for xfer, waiting up to ms for it; or None."""
        end = time.time() + ms / 1000
        while not self.events.get(xfer) and time.time() < end:
            self.pump(50)
        evs = self.events.get(xfer) or [None]
        return evs[0]

    def n_events(self, xfer):
        return len(self.events.get(xfer, []))

    def close(self):
        if self.lane:
            self.lane.close()
        self.sock.close()
        self.shm.close()
        self.shm.unlink()


class Rig:
    """Real pdx-agents, one per side, each with an Engine (not registered
    yet), in a zmq context of their own (metrics: each serves /metrics, its
    URL in self.metrics; side_args: more arguments for a side's agent;
    tls: UCX_TLS, or a side's own in a dict).
    As a context manager it tears down on the way out: what was given to
    adopt() closed first, then the engines; the agents get SIGTERM and
    each must exit 0 (a check)."""

    def __init__(self, agent_bin, name, sides, agent_args=(), metrics=False,
                 tls="sm,self", side_args=None):
        self.tmp = tempfile.mkdtemp(prefix=f"pdx-{name}-")
        self.sides = sides
        self.ctx = zmq.Context()
        self.agents, self.engines, self.adopted = [], [], []
        self.metrics = []  # with metrics: each agent's /metrics URL
        # picked at once, distinct: an agent started has not bound its
        # port yet when the next one's is picked (two agents were given
        # one port, and the second exited "Address already in use": a
        # fresh-CI run, silent_peer)
        ports = free_ports(2 * len(sides))
        try:
            for side in sides:
                env = dict(os.environ, UCX_WARN_UNUSED_ENV_VARS="n",
                           UCX_TLS=tls if isinstance(tls, str) else tls[side])
                eng = f"ipc://{self.tmp}/{side}.engine"
                extra = []
                if metrics:
                    m = f"127.0.0.1:{ports.pop()}"
                    extra = ["--metrics", m]
                    self.metrics.append(f"http://{m}/metrics")
                self.agents.append(subprocess.Popen(
                    [agent_bin, "--engine", eng, "--listen",
                     f"tcp://127.0.0.1:{ports.pop()}", "--xfer-timeout-ms", "5000",
                     *extra, *agent_args, *(side_args or {}).get(side, ())],
                    env=env, stdout=subprocess.DEVNULL))
                self.engines.append(
                    Engine(self.ctx, f"pdx-{name}-{os.getpid()}-{side}", eng))
        except BaseException:
            self.close()
            raise

    def adopt(self, thing):
        """thing.close() is called at the end, before the engines'."""
        self.adopted.append(thing)
        return thing

    def register(self):
        """Registers every side's engine (a check each); their agents'
        peer addresses, side order (None where one was not registered)."""
        addrs = []
        for side, e in zip(self.sides, self.engines):
            reply = e.register()
            ok = reply is not None and reply.get("op") == "registered"
            check(ok, f"engine {side} registers: {reply}")
            addrs.append(reply["peer"] if ok else None)
        return addrs

    def agents_run(self):
        return all(a.poll() is None for a in self.agents)

    def close(self):
        for t in self.adopted + self.engines:
            t.close()
        for a in self.agents:
            a.terminate()
        for a in self.agents:
            try:
                rc = a.wait(10)
            except subprocess.TimeoutExpired:
                a.kill()
                rc = a.wait()
            check(rc == 0, f"agent exits cleanly ({rc})")
        self.ctx.term()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
