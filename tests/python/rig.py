"""What the python suite's tests share: real pdx-agents on loopback, each
in a temporary directory with its engine address, and a layout over a
pdx.SharedPool that both sides of a transfer use.

    with Agents(agent_bin, "p", "d") as ag:
        ag.engine("p")  # ipc:// address of agent p
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pdx

LAYERS, TENSORS, BLOCKS = 4, 2, 64
BLOCK_TOKENS, KV_HEADS, HEAD_DIM, DTYPE = 4, 2, 16, 2
BLOCK_BYTES = BLOCK_TOKENS * KV_HEADS * HEAD_DIM * DTYPE
POOL_BYTES = LAYERS * TENSORS * BLOCKS * BLOCK_BYTES


def free_port():
    """A free loopback port below the kernel's ephemeral range
    (scripts/free-ports says why)."""
    return int(subprocess.check_output([sys.executable, os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts",
        "free-ports")]))


def layout(blocks=BLOCKS, head_dim=HEAD_DIM, base=0):
    """Layer-major in one region: K then V of each layer."""
    bb = BLOCK_TOKENS * KV_HEADS * head_dim * DTYPE
    return pdx.Layout(
        blocks=blocks, block_tokens=BLOCK_TOKENS, kv_heads=KV_HEADS,
        head_dim=head_dim, dtype_bytes=DTYPE,
        bases=[[(0, base + (TENSORS * l + t) * blocks * bb)
                for t in range(TENSORS)] for l in range(LAYERS)],
        block_stride=[bb] * LAYERS)


def block_at(buf, layer, tensor, block):
    off = ((TENSORS * layer + tensor) * BLOCKS + block) * BLOCK_BYTES
    return bytes(buf[off:off + BLOCK_BYTES])


def same_blocks(src_buf, src, dst_buf, dst, layers=range(LAYERS)):
    return all(block_at(src_buf, l, t, s) == block_at(dst_buf, l, t, d)
               for l in layers for t in range(TENSORS)
               for s, d in zip(src, dst))


def wait_for(cond, timeout, step=0.02):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(step)
    return cond()


class Agents:
    """Real pdx-agents by name; each must exit 0 on SIGTERM at close()
    unless the test killed it (kill())."""

    def __init__(self, agent_bin, *names, args=()):
        self.tmp = tempfile.mkdtemp(prefix="pdx-py-")
        self.bin, self.args = agent_bin, list(args)
        self.procs, self.listen, self.killed = {}, {}, set()
        self.bad_exits = []
        for n in names:
            self.listen[n] = "tcp://127.0.0.1:%d" % free_port()
            self.start(n)

    def engine(self, name):
        return "ipc://%s/%s.engine" % (self.tmp, name)

    def start(self, name):
        env = dict(os.environ, UCX_TLS="sm,self", UCX_WARN_UNUSED_ENV_VARS="n")
        with open(os.path.join(self.tmp, name + ".log"), "ab") as log:
            self.procs[name] = subprocess.Popen(
                [self.bin, "--engine", self.engine(name), "--listen",
                 self.listen[name], "--xfer-timeout-ms", "5000", *self.args],
                env=env, stdout=subprocess.DEVNULL, stderr=log)
        sock = os.path.join(self.tmp, name + ".engine")
        if not wait_for(lambda: os.path.exists(sock), 10):
            raise RuntimeError("agent %s did not start" % name)
        self.killed.discard(name)

    def kill(self, name, sig=signal.SIGKILL):
        self.procs[name].send_signal(sig)
        self.procs[name].wait(10)
        self.killed.add(name)

    def log(self, name):
        with open(os.path.join(self.tmp, name + ".log"), errors="replace") as f:
            return f.read()

    def close(self):
        for n, p in self.procs.items():
            if p.poll() is None:
                p.terminate()
        for n, p in self.procs.items():
            try:
                rc = p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                rc = p.wait()
            if n not in self.killed and rc != 0:
                self.bad_exits.append("%s exited %s: %s" % (n, rc,
                                                           self.log(n)[-2000:]))
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def start_server(cmd, log, new_session=False):
    """Starts an HTTP server (its stderr to the file log) and waits until
    it logs "listening on http://HOST:PORT" (30 s at most): (process,
    that URL). new_session: its own process group, to signal it whole."""
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log,
                         start_new_session=new_session)
    end = time.monotonic() + 30
    while time.monotonic() < end:
        with open(log.name) as f:
            m = re.search(r"listening on (http://[0-9.:]+)", f.read())
        if m:
            return p, m.group(1)
        if p.poll() is not None:
            break
        time.sleep(0.05)
    with open(log.name) as f:
        raise RuntimeError("%s did not start: %s" % (" ".join(cmd[:2]),
                                                      f.read()))
