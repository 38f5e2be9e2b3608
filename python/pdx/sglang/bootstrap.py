"""The bootstrap server (one per prefill instance, at SGLang's
--disaggregation-bootstrap-port) and its two clients: a prefill rank
registering its agent, a decode rank asking which agent holds a room's KV.

Routes, named as SGLang's CommonKVBootstrapServer names them:
  PUT /route   a prefill rank: {attn_tp_size, attn_tp_rank, pp_size,
               pp_rank, dp_size, dp_rank, follow_bootstrap_room,
               peer_addr, shape}
  GET /route?prefill_dp_rank=&target_tp_rank=&target_pp_rank=
               that rank's registration (404 when none); all three -1:
               the instance's sizes (503 until every rank registered)
  POST /register_dp_rank {bootstrap_room, dp_rank}
               with DP attention, the DP rank a room's request went to,
               when the prefill instance does not route by the room
               (load_balance_method other than follow_bootstrap_room)
  POST /query_dp_ranks {bootstrap_rooms: [...]}
               {"room": dp_rank} of those registered: SGLang's decode.py
               asks it itself (CommonKVReceiver.query_prefill_dp_ranks)
  GET /health  "OK"
The room reaches the server only for the DP rank: both sides make the
transfer id from it (xfer_id), so the decode side needs nothing of the
prefill side but its agent's peer address and its layout.
"""
import collections
import http.client
import json
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional
from urllib.parse import parse_qs, urlparse


# rooms whose DP rank the server keeps (the oldest go first): far more
# than the requests a prefill instance holds at once
ROOMS_MAX = 65536


class PdxKVBootstrapServer:
    """SGLang builds it with (host, port) in the prefill instance; it
    serves from a daemon thread until close()."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.ranks = {}   # (dp, tp, pp) -> registration
        self.sizes = None
        self.room_dp = collections.OrderedDict()  # room -> DP rank
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self, code, body):
                data = (body if isinstance(body, str) else
                        json.dumps(body)).encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                url = urlparse(self.path)
                if url.path == "/health":
                    return self._answer(200, "OK")
                if url.path != "/route":
                    return self._answer(404, "no route %s" % url.path)
                self._answer(*server._get(parse_qs(url.query)))

            def _body(self):
                n = int(self.headers.get("Content-Length", 0))
                return json.loads(self.rfile.read(n))

            def do_PUT(self):
                if urlparse(self.path).path != "/route":
                    return self._answer(404, "no route %s" % self.path)
                try:
                    reg = self._body()
                except ValueError as e:
                    return self._answer(400, "not JSON: %s" % e)
                self._answer(*server._put(reg))

            def do_POST(self):
                route = {"/register_dp_rank": server._register_dp_rank,
                         "/query_dp_ranks": server._query_dp_ranks}.get(
                             urlparse(self.path).path)
                if route is None:
                    return self._answer(404, "no route %s" % self.path)
                try:
                    body = self._body()
                except ValueError as e:
                    return self._answer(400, "not JSON: %s" % e)
                self._answer(*route(body))

        self.http = ThreadingHTTPServer((host, port), Handler)
        self.http.daemon_threads = True
        self.thread = threading.Thread(target=self.http.serve_forever,
                                       daemon=True)
        self.thread.start()

    def _put(self, reg):
        try:
            key = (int(reg["dp_rank"]), int(reg["attn_tp_rank"]),
                   int(reg["pp_rank"]))
            sizes = {"attn_tp_size": int(reg["attn_tp_size"]),
                     "pp_size": int(reg["pp_size"]),
                     "dp_size": int(reg["dp_size"]),
                     "follow_bootstrap_room":
                         bool(reg.get("follow_bootstrap_room", True))}
            reg["peer_addr"], reg["shape"]
        except (KeyError, TypeError, ValueError) as e:
            return 400, "registration lacks %s" % e
        with self.lock:
            if self.sizes is None:
                self.sizes = sizes
            elif self.sizes != sizes:
                return 409, "rank %s says %s, others %s" % (key, sizes,
                                                            self.sizes)
            self.ranks[key] = reg
        return 200, "OK"

    def _get(self, q):
        try:
            dp, tp, pp = (int(q[k][0]) for k in ("prefill_dp_rank",
                                                 "target_tp_rank",
                                                 "target_pp_rank"))
        except (KeyError, ValueError):
            return 400, "want prefill_dp_rank, target_tp_rank, target_pp_rank"
        with self.lock:
            sizes = self.sizes
            want = (sizes["dp_size"] * sizes["attn_tp_size"] *
                    sizes["pp_size"]) if sizes else None
            if want is None or len(self.ranks) < want:
                return 503, "prefill not fully registered (%d ranks)" % \
                    len(self.ranks)
            if (dp, tp, pp) == (-1, -1, -1):
                return 200, dict(sizes)
            reg = self.ranks.get((dp, tp, pp))
        if reg is None:
            return 404, "no prefill rank dp %d tp %d pp %d registered" % (
                dp, tp, pp)
        return 200, reg

    def _register_dp_rank(self, body):
        try:
            room, dp = int(body["bootstrap_room"]), int(body["dp_rank"])
        except (KeyError, TypeError, ValueError) as e:
            return 400, "want bootstrap_room and dp_rank: %s" % e
        with self.lock:
            self.room_dp[room] = dp
            self.room_dp.move_to_end(room)
            while len(self.room_dp) > ROOMS_MAX:
                self.room_dp.popitem(last=False)
        return 200, "OK"

    def _query_dp_ranks(self, body):
        try:
            rooms = [int(r) for r in body["bootstrap_rooms"]]
        except (KeyError, TypeError, ValueError) as e:
            return 400, "want bootstrap_rooms, a list of rooms: %s" % e
        with self.lock:
            return 200, {str(r): self.room_dp[r] for r in rooms
                         if r in self.room_dp}

    def close(self):
        self.http.shutdown()
        self.http.server_close()
        self.thread.join(5)


def _url(addr: str, path: str) -> str:
    return "http://%s%s" % (addr, path)


def register(addr: str, reg: dict, timeout: float = 5.0) -> None:
    """PUT a prefill rank's registration at the server addr (host:port);
    raises OSError (refused, answered not 200) with the server's words."""
    req = urllib.request.Request(_url(addr, "/route"), method="PUT",
                                 data=json.dumps(reg).encode())
    _call(req, timeout)


def query(addr: str, dp: int, tp: int, pp: int,
          timeout: float = 5.0) -> Optional[dict]:
    """The registration of prefill rank (dp, tp, pp) (all -1: the sizes);
    None while the server is not up or not complete (try again); raises
    LookupError when the server says no such rank or refuses the ask."""
    try:
        return ask(addr, dp, tp, pp, timeout)
    except OSError:
        return None


def ask(addr: str, dp: int, tp: int, pp: int,
        timeout: float = 5.0) -> Optional[dict]:
    """query, but a server that did not answer (refused, timed out, cut
    off mid-answer) raises OSError saying so; None: it answered that not
    every prefill rank registered yet."""
    req = urllib.request.Request(_url(addr, "/route?prefill_dp_rank=%d&"
                                      "target_tp_rank=%d&target_pp_rank=%d"
                                      % (dp, tp, pp)))
    try:
        return json.loads(_call(req, timeout))
    except urllib.error.HTTPError as e:
        if e.code == 503:
            return None
        raise LookupError("bootstrap server %s: %d %s" % (
            addr, e.code, e.read().decode(errors="replace")))
    except urllib.error.URLError as e:
        raise OSError(str(e.reason)) from e
    except http.client.HTTPException as e:
        # the server died while it spoke: IncompleteRead is no OSError
        raise OSError("cut off mid-answer: %r" % e) from e


def register_dp_rank(addr: str, room: int, dp_rank: int,
                     timeout: float = 5.0) -> None:
    """The prefill side (CommonKVSender's _register_prefill_dp_rank): the
    DP rank room's request runs on; raises OSError with why."""
    req = urllib.request.Request(
        _url(addr, "/register_dp_rank"), method="POST",
        data=json.dumps({"bootstrap_room": room, "dp_rank": dp_rank}
                        ).encode())
    _call(req, timeout)


def query_dp_ranks(addr: str, rooms, timeout: float = 5.0) -> dict:
    """What SGLang's decode.py asks (CommonKVReceiver.query_prefill_dp_
    ranks): {"room": dp_rank} of the rooms registered; {} on any error."""
    req = urllib.request.Request(
        _url(addr, "/query_dp_ranks"), method="POST",
        data=json.dumps({"bootstrap_rooms": list(rooms)}).encode())
    try:
        return json.loads(_call(req, timeout))
    except (OSError, ValueError, http.client.HTTPException):
        return {}


def _call(req, timeout) -> bytes:
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read()
