"""The pdx-agent beside a vLLM worker: the one configured
(kv_connector_extra_config "agent": its engine address, "{rank}" standing
for the tensor-parallel rank), or one started here for this rank and
stopped with the worker.
"""
import atexit
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from typing import List, Optional


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


_PR_SET_PDEATHSIG = 1
_prctl = ctypes.CDLL(None, use_errno=True).prctl


def _die_with(parent: int):
    """preexec_fn: SIGTERM the agent when its engine's process dies, also
    by SIGKILL (atexit never runs then), or the agent lives on holding its
    port and a mapping of the KV pool. Only a prepared ctypes call runs
    here, between fork and exec."""
    def pre():
        _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # it died before the prctl
            os._exit(1)
    return pre


class AgentProcess:
    """pdx-agent started for one worker: engine link in a private
    directory, peer link on listen_host at a free port. stop() (also at
    exit) ends it; a started agent that exits early is an error that
    carries its last log lines."""

    def __init__(self, binary: str = "pdx-agent",
                 listen_host: str = "127.0.0.1", args: List[str] = (),
                 start_timeout: float = 10.0,
                 listen_host_key: str = "listen_host"):
        """listen_host_key: the setting listen_host came from, named when
        it is one this host cannot listen on."""
        path = shutil.which(binary) or binary
        try:  # before mkdtemp: nothing to clean up when it fails
            port = _free_port(listen_host)
        except OSError as e:
            raise RuntimeError("pdx: %s %r: cannot listen there: %s" %
                               (listen_host_key, listen_host, e)) from e
        # named by our pid: what killed us (no stop() ran) finds its log
        self.dir = tempfile.mkdtemp(prefix="pdx-agent-%d-" % os.getpid())
        self.engine_addr = "ipc://%s/engine" % self.dir
        self.log_path = os.path.join(self.dir, "agent.log")
        self.listen = "tcp://%s:%d" % (listen_host, port)
        self._argv = [path, "--engine", self.engine_addr, "--listen",
                      self.listen, *args]
        self._start_timeout = start_timeout
        self.proc: Optional[subprocess.Popen] = None
        atexit.register(self.stop)
        self._spawn()

    def _spawn(self) -> None:
        # PR_SET_PDEATHSIG follows the thread that forks, not the process:
        # started from another thread, the agent would be stopped when that
        # thread ends. The main thread lasts as long as the process (vLLM's
        # and SGLang's workers build their connector there); from any other
        # thread (a restart, say) the agent goes without, as before.
        pre = (_die_with(os.getpid())
               if threading.current_thread() is threading.main_thread()
               else None)
        sock = os.path.join(self.dir, "engine")
        try:  # a killed agent's socket file: the new one's appears
            os.unlink(sock)
        except FileNotFoundError:
            pass
        with open(self.log_path, "ab") as log:
            try:
                self.proc = subprocess.Popen(
                    self._argv, stdout=subprocess.DEVNULL, stderr=log,
                    preexec_fn=pre)
            except OSError as e:
                self.stop()
                raise RuntimeError("pdx: cannot start %s: %s (set "
                                   "kv_connector_extra_config agent_bin, or "
                                   "agent to a running agent)" %
                                   (self._argv[0], e))
        end = time.monotonic() + self._start_timeout
        while not os.path.exists(sock):
            if self.proc.poll() is not None or time.monotonic() > end:
                why = self.log_tail()
                self.stop()
                raise RuntimeError("pdx: pdx-agent did not start: " + why)
            time.sleep(0.02)

    def exited(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None

    def restart(self) -> None:
        """The agent exited: started again at the same engine and peer
        addresses, so its engine registers again by itself (libpdx) and
        the peer address given out stays right. RuntimeError when it
        does not start (the directory is gone then: stop())."""
        self._spawn()

    def log_tail(self, n: int = 5) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return " | ".join(f.read().splitlines()[-n:])
        except OSError:
            return ""

    def stop(self) -> None:
        p, self.proc = getattr(self, "proc", None), None
        if p is not None and p.poll() is None:
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
