#!/usr/bin/python3
"""xferbench_cleanup: what a pdx-xferbench stopped early leaves behind, and
how long it waits for agents that say nothing. Its engines' KV pools are
/dev/shm/pdx-xb-PID-* (PID the run's); each check runs the tiny model with
modeled compute so that it is stopped mid-iteration.

* SIGTERM: nothing of it is left (no pool, no process, no directory in
  /tmp).
* A test runner's timeout (SIGTERM, then SIGKILL 0.5 s later) while an
  agent is slow to exit (stopped): the pools are gone all the same (they
  are unlinked before the processes are waited for).
* SIGKILL: its pools stay (nothing can run), and the next run sweeps them;
  its directory /tmp/pdx-PID-* stays too, and the test removes it.
* The engines wait for a transfer's events --xfer-timeout-ms (or the
  agents' 30 s) + layers x --layer-ms + 5 s, as the run says at start,
  not a fixed minute.
* The largest run's 40 processes all fit the cleanup registry.
* pdx-agents stopped by SIGTERM while starting leave no ucx_shm_posix_*.

    xferbench_cleanup.py PDX-XFERBENCH PDX-AGENT
"""
import contextlib
import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from xb_check import check, finish

LAYERS = 4  # tiny's, common/models.c
GRACE_S = 5  # XB_EVENT_GRACE_MS, bench/xb_opts.h


def pools(pid):
    return sorted(f for f in os.listdir("/dev/shm")
                  if f.startswith("pdx-xb-%d-" % pid))


def children(pid):
    """pid's child processes: (pid, comm)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                st = f.read()
        except OSError:
            continue
        comm = st[st.index("(") + 1:st.rindex(")")]
        if int(st[st.rindex(")") + 2:].split()[1]) == pid:
            out.append((int(d), comm))
    return out


def gone(pids, timeout=10):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not any(os.path.exists("/proc/%d" % p) for p in pids):
            return True
        time.sleep(0.05)
    return False


class Run:
    """pdx-xferbench mid-run: started, then waited for until it reports
    `until` (its first measured iteration) on stderr."""

    def __init__(self, xb, agent, extra=(), layer_ms=50, until="iteration 1"):
        self.log = tempfile.TemporaryFile(mode="w+")
        self.p = subprocess.Popen(
            [xb, "--model", "tiny", "--tokens", "64", "--iters", "1000",
             "--layer-ms", str(layer_ms), "--agent-bin", agent] + list(extra),
            stdout=subprocess.DEVNULL, stderr=self.log,
            start_new_session=True)
        end = time.monotonic() + 30
        while until not in self.stderr() and time.monotonic() < end:
            if self.p.poll() is not None:
                break
            time.sleep(0.02)
        check(until in self.stderr(), "no %r from pdx-xferbench in 30 s:\n%s"
              % (until, self.stderr()[-2000:]))
        self.kids = children(self.p.pid)
        self.pools = pools(self.p.pid)
        check(len(self.pools) == 2, "its pools: %r" % self.pools)

    def stderr(self):
        self.log.seek(0)
        return self.log.read()

    def agents(self):
        return [p for p, comm in self.kids if comm == "pdx-agent"]

    def wait(self, timeout=30):
        try:
            return self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait()
            return None

    def tmpdirs(self):
        return glob.glob("/tmp/pdx-%d-*" % self.p.pid)

    def remove_tmpdirs(self):
        """What a SIGKILL left (nothing of the run could remove it)."""
        for d in self.tmpdirs():
            shutil.rmtree(d, ignore_errors=True)

    def check_clean(self, what):
        check(gone([p for p, _ in self.kids]),
              "%s: processes left: %r" % (what, children(self.p.pid)))
        left = pools(self.p.pid)
        check(not left, "%s: left in /dev/shm: %r" % (what, left))
        for f in left:
            os.unlink("/dev/shm/" + f)


def sigterm(xb, agent):
    r = Run(xb, agent)
    r.p.send_signal(signal.SIGTERM)
    rc = r.wait()
    check(rc == 1, "SIGTERM: exit status %r, want 1" % rc)
    r.check_clean("SIGTERM")
    left = r.tmpdirs()
    check(not left, "SIGTERM: left in /tmp: %r" % left)
    r.remove_tmpdirs()
    print("ok: SIGTERM mid-run leaves nothing")


def runner_timeout(xb, agent):
    r = Run(xb, agent)
    for a in r.agents():
        os.kill(a, signal.SIGSTOP)
    os.killpg(r.p.pid, signal.SIGTERM)
    time.sleep(0.5)
    os.killpg(r.p.pid, signal.SIGKILL)
    r.wait()
    r.check_clean("SIGTERM, SIGKILL 0.5 s later")
    r.remove_tmpdirs()
    print("ok: SIGTERM then SIGKILL, agents slow to exit: no pool left")


def sigkill_then_sweep(xb, agent):
    r = Run(xb, agent)
    r.p.kill()
    r.wait()
    check(gone([p for p, _ in r.kids]), "SIGKILL: its children stayed")
    r.remove_tmpdirs()
    # what stays depends on which engine the kernel ended first; the next
    # run removes what did
    time.sleep(1)  # PDX_SHM_OBJECT_SWEEP_MIN_AGE_S, were they younger
    p = subprocess.run([xb, "--model", "tiny", "--tokens", "16", "--iters",
                        "1", "--agent-bin", agent], capture_output=True,
                       text=True, timeout=60)
    check(p.returncode == 0, "the next run exited %d:\n%s" %
          (p.returncode, p.stderr[-2000:]))
    left = pools(r.p.pid)
    check(not left, "SIGKILL: the next run left %r in /dev/shm" % left)
    for f in left:
        os.unlink("/dev/shm/" + f)
    print("ok: SIGKILL's pools swept by the next run")


def ucx_segments():
    return {f for f in os.listdir("/dev/shm") if f.startswith("ucx_shm_posix_")}


def in_use(names):
    """Those of the /dev/shm names some live process has open or mapped:
    another test's agents (scripts/test runs two at a time), not ours,
    which are gone."""
    paths = {"/dev/shm/" + n: n for n in names}
    used = set()
    def read(what, nothing=()):  # a process that ended meanwhile
        try:
            return what()
        except OSError:
            return nothing

    def held(path):  # one unlinked since is said "PATH (deleted)"
        used.add(paths.get(path.strip().removesuffix(" (deleted)")))

    for pid in filter(str.isdigit, os.listdir("/proc")):
        fds = "/proc/%s/fd" % pid
        for fd in read(lambda: os.listdir(fds)):
            held(read(lambda: os.readlink(fds + "/" + fd), ""))
        for line in read(lambda: open("/proc/%s/maps" % pid).readlines()):
            held(line.split(None, 5)[-1])
    return used - {None}


def agent_startup(agent):
    """pdx-agents stopped by SIGTERM while they start (as the cleanup of
    a run stopped early stops them) leave no UCX segment: one that came
    during UCX's init killed the agent between UCX's shm_open() of a
    segment and its unlink (a few in 20 here)."""
    before = ucx_segments()
    d = tempfile.mkdtemp(prefix="pdx-xbc-")
    env = dict(os.environ, UCX_TLS="sm,self")
    for i in range(20):
        a = subprocess.Popen([agent, "--engine", "ipc://%s/e%d" % (d, i),
                              "--listen", "tcp://127.0.0.1:0"],
                             stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, env=env)
        time.sleep(0.005 + (i * 7 % 60) / 1000)
        a.terminate()
        a.wait(10)
    time.sleep(1)  # a live agent's segments are unlinked once mapped
    new = ucx_segments() - before
    # still there after the scan: one another agent unlinked meanwhile
    # was its own
    left = sorted((new - in_use(new)) & ucx_segments())
    check(not left, "agents stopped while starting left %r in /dev/shm" %
          left)
    for f in left:
        with contextlib.suppress(FileNotFoundError):
            os.unlink("/dev/shm/" + f)
    for f in os.listdir(d):
        os.unlink(os.path.join(d, f))
    os.rmdir(d)
    print("ok: 20 agents stopped while starting: no UCX segment left")


def registry(xb, agent):
    """The largest run (--prefill-tp 8 --decode-tp 4 --versus tp: 20
    agents and 20 engines) has every process in the cleanup registry
    (it held 32: 8 were not killed by the cleanup)."""
    p = subprocess.run([xb, "--model", "llama3-8b", "--tokens", "64",
                        "--prefill-tp", "8", "--decode-tp", "4", "--versus",
                        "tp", "--iters", "1", "--agent-bin", agent],
                       capture_output=True, text=True, timeout=60)
    check(p.returncode == 0, "TP 8 -> 4: exit status %d:\n%s" %
          (p.returncode, p.stderr[-2000:]))
    check("registry full" not in p.stderr, "TP 8 -> 4: %s" %
          [ln for ln in p.stderr.splitlines() if "registry full" in ln][:3])
    print("ok: TP 8 -> 4 --versus tp: every process tracked")


def wait_bound(xb, agent):
    """The engines' wait for a transfer's events follows --xfer-timeout-ms
    and the modeled compute (it was a fixed 60 s: a run whose transfer
    the agents allowed longer failed at 60 s). The run says its bound."""
    for opts, want in (([], 30 + GRACE_S),
                       (["--xfer-timeout-ms", "120000", "--layer-ms", "250"],
                        120 + LAYERS * 250 // 1000 + GRACE_S)):
        p = subprocess.run([xb, "--model", "tiny", "--tokens", "16",
                            "--iters", "1", "--agent-bin", agent] + opts,
                           capture_output=True, text=True, timeout=60)
        check(p.returncode == 0, "%r: exit status %d:\n%s" %
              (opts, p.returncode, p.stderr[-2000:]))
        line = "a transfer's events waited for %d s at most" % want
        check(line in p.stderr, "%r: no %r in its log" % (opts, line))
    print("ok: the wait for events follows --xfer-timeout-ms and --layer-ms")


def main():
    xb, agent = sys.argv[1], sys.argv[2]
    sigterm(xb, agent)
    runner_timeout(xb, agent)
    sigkill_then_sweep(xb, agent)
    wait_bound(xb, agent)
    registry(xb, agent)
    agent_startup(agent)
    finish()


if __name__ == "__main__":
    main()
