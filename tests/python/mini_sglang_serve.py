"""mini_sglang behind HTTP, the way `python -m sglang.launch_server
--disaggregation-mode prefill|decode` puts SGLang behind its server, so
routers (SGLang's, pdx-proxy --flow sglang) drive it as they drive SGLang:

    python3 mini_sglang_serve.py --port 0 --disaggregation-mode prefill \\
        --disaggregation-bootstrap-port 8998
    python3 mini_sglang_serve.py --port 0 --disaggregation-mode decode

A router sends the same request to both at once with bootstrap_host,
bootstrap_port and bootstrap_room added (sgl-project/sglang's mini_lb.py;
docs/sglang.md): the prefill server computes the prompt's KV, its
pdx.sglang sender pushes it to the decode server's receiver, and each
answers when its side is done (prefill: the first token; decode: the whole
completion). The model is pdx-engine's synthetic one (mini_model.py) on an
SGLang MHA pool (mini_sglang.Pool): the decode side checks every received
position against the prompt, takes its first token from the received KV
and compares it with the one the aux row carried, then decodes on, so its
text equals a colocated pdx-engine --model tiny's only when the KV
arrived byte for byte.

Routes: POST /v1/completions (streamed or not) and /generate, GET /health,
/v1/models and /get_server_info (server_args' disaggregation_bootstrap_port
among its fields, as SGLang's answers it). Logs `listening on http://H:P`
once it listens (--port 0 picks one). The pdx agent is started per
pdx.sglang's environment (PDX_SGLANG_AGENT_BIN, ...).
"""
import argparse
import array
import json
import queue
import signal
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch

import pdx
import pdx.sglang
from mini_model import Model, ParseError
from mini_sglang import (Decode, Pool, Prefill, Req, ServerArgs,
                         num_pages)
from pdx.sglang import KVPoll

CLASSES = {"manager": pdx.sglang.PdxKVManager,
           "sender": pdx.sglang.PdxKVSender,
           "receiver": pdx.sglang.PdxKVReceiver,
           "bootstrap_server": pdx.sglang.PdxKVBootstrapServer}
BOOTSTRAP_FIELDS = ("bootstrap_host", "bootstrap_port", "bootstrap_room")


class Kv:
    """The SGLang pool as a pdx layout of the synthetic model, so its
    functions (fill, next_token, check) run on SGLang's buffers."""

    def __init__(self, m: Model, pages: int):
        dtype = {2: torch.bfloat16, 4: torch.float32}[m.dtype_bytes]
        self.pool = Pool(layers=m.layers, pages=pages,
                         page_size=m.block_tokens, heads=m.kv_heads,
                         head_dim=m.head_dim, dtype=dtype,
                         mla=m.tensors == 1)
        self.base = self.pool.shm.address
        bufs = self.pool.buffers
        stride = Pool.nbytes(bufs[0][0][0]) * m.block_tokens
        self.layout = pdx.Layout(
            blocks=pages + 1, block_tokens=m.block_tokens,
            kv_heads=m.kv_heads, head_dim=m.head_dim,
            dtype_bytes=m.dtype_bytes, tensors=m.tensors,
            bases=[[(0, bufs[t][l].data_ptr() - self.base)
                    for t in range(m.tensors)] for l in range(m.layers)],
            block_stride=[stride] * m.layers)
        self.c, self._layers = self.layout._c()
        assert Model.layout_ok(self.c)


class Job(Req):
    """One HTTP request: mini_sglang's Req, the prompt's tokens and
    hashes, and what the handler waits for."""

    def __init__(self, room, tokens, max_tokens, host):
        super().__init__(room, len(tokens))
        self.bootstrap_host = host
        self.tokens, self.max_tokens = list(tokens), max_tokens
        self.hashes = array.array("Q")
        self.out = []
        self.ended = threading.Event()


class ServePrefill(Prefill):
    def forward(self, req, pages, a, b):
        """The synthetic model writes positions [a, b) in every layer;
        the last chunk samples the first token from the KV."""
        kv, m = self.kv, self.model
        Model.extend_hashes(req.hashes, req.tokens, b)
        blocks = array.array("I", req.pages)
        for layer in range(m.layers):
            Model.fill(kv.c, kv.base, blocks, req.hashes, layer, a, b)
        if b == req.prompt_len:
            req.first_token = m.next_token(kv.c, kv.base, blocks, b)


class Engine:
    """The scheduler thread: mini_sglang's event loop of one role, fed by
    the HTTP handlers."""

    def __init__(self, role, bootstrap_port, model, pages):
        self.role, self.model = role, Model(model)
        self.kv = Kv(self.model, pages)
        sa = ServerArgs(bootstrap_port)
        if role == "prefill":
            self.sched = ServePrefill(CLASSES, sa, self.kv.pool)
            self.sched.kv, self.sched.model = self.kv, self.model
        else:
            self.sched = Decode(CLASSES, sa, self.kv.pool)
        self.inbox = queue.Queue()
        self.jobs = []
        self.error = None
        self.stopping = False
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def submit(self, job: Job, timeout: float):
        self.inbox.put(job)
        if not job.ended.wait(timeout):
            job.error = job.error or "not done in %.0f s" % timeout
            job.cancel = True
            job.ended.wait(5)
        return job

    def _loop(self):
        try:
            while not self.stopping:
                self._take(0.01 if not self.jobs else 0)
                self.sched.step()
                self._finish()
                if self.jobs:
                    time.sleep(0.002)
        except Exception as e:   # the server answers 503 from now on
            self.error = e
            for job in self.jobs:
                job.error = "engine failed: %r" % e
                job.ended.set()

    def _take(self, wait):
        try:
            job = self.inbox.get(timeout=wait) if wait else \
                self.inbox.get_nowait()
        except queue.Empty:
            return
        job.cancel = False
        self.jobs.append(job)
        if self.role == "prefill":
            self.sched.add(job)
        else:
            self.sched.add(job, job.bootstrap_port)

    def _finish(self):
        for job in list(self.jobs):
            if job.done is None and job.cancel:
                self._abort(job)
            if job.done is None:
                continue
            self.jobs.remove(job)
            if job.done == KVPoll.Success:
                if self.role == "prefill":
                    job.out = [job.first_token]
                else:
                    self._decode(job)
            else:
                job.error = job.error or "transfer failed"
            self.kv.pool.free.extend(job.pages)
            self._free_row(job)
            job.ended.set()

    def _free_row(self, job):
        """The request's aux row, zeroed (decode.py's gate waits for a
        room in it), when mini_sglang's own _end did not give it back."""
        meta = self.sched.meta
        if job.meta < 0 or job.meta in meta.free:
            return
        meta.zero(job.meta)
        meta.free.append(job.meta)

    def _abort(self, job):
        """The handler gave up: SGLang's AbortReq, the request leaves the
        queues."""
        s = self.sched
        for q in ([s.bootstrapping, s.running, s.inflight]
                  if self.role == "prefill" else
                  [s.pending, s.queue, s.transfer]):
            if job in q:
                q.remove(job)
        end = job.sender if self.role == "prefill" else job.receiver
        end.abort()
        end.clear()
        job.done = KVPoll.Failed

    def _decode(self, job):
        """Checks the received prompt KV, samples the first token from it
        (it must be the one the aux row carried), then decodes on."""
        kv, m, n = self.kv, self.model, job.prompt_len
        Model.extend_hashes(job.hashes, job.tokens, n)
        blocks = array.array("I", job.pages)
        bad = Model.check(kv.c, kv.base, blocks, job.hashes, 0, n)
        if bad >= 0:
            job.error = "received KV differs at position %d" % bad
            return
        tok = m.next_token(kv.c, kv.base, blocks, n)
        if tok != job.got_token:
            job.error = "first token %d from the KV, %d in the aux row" % (
                tok, job.got_token)
            return
        more = kv.pool.alloc(num_pages(n + job.max_tokens,
                                       kv.pool.page_size) - len(job.pages))
        job.pages += more
        blocks.extend(more)
        job.out = [tok]
        while len(job.out) < job.max_tokens:
            job.tokens.append(tok)
            pos = len(job.tokens)
            Model.extend_hashes(job.hashes, job.tokens, pos)
            for layer in range(m.layers):
                Model.fill(kv.c, kv.base, blocks, job.hashes, layer,
                           pos - 1, pos)
            tok = m.next_token(kv.c, kv.base, blocks, pos)
            job.out.append(tok)

    def close(self):
        self.stopping = True
        self.thread.join(10)
        self.sched.close()
        self.kv.pool.close()


def error_body(status, message):
    return {"object": "error", "message": message, "code": status}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    engine: Engine = None
    args = None

    def log_message(self, fmt, *args):
        pass

    def reply(self, status, obj=None):
        body = b"" if obj is None else json.dumps(obj).encode()
        self.send_response(status)
        if obj is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        e, a = self.engine, self.args
        if self.path == "/health":
            return self.reply(503 if e.error else 200)
        if self.path == "/v1/models":
            return self.reply(200, {"object": "list", "data": [{
                "id": a.model, "object": "model", "owned_by": "sglang"}]})
        if self.path == "/get_server_info":
            return self.reply(200, {
                "model_path": a.model, "host": a.host, "port": a.port,
                "disaggregation_mode": a.disaggregation_mode,
                "disaggregation_transfer_backend": "nixl",
                "disaggregation_bootstrap_port":
                    a.disaggregation_bootstrap_port})
        self.reply(404, error_body(404, "no route %s" % self.path))

    def do_POST(self):
        if self.path not in ("/v1/completions", "/generate"):
            return self.reply(404, error_body(404, "no route %s" % self.path))
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        try:
            body = json.loads(raw)
            boot = {k: body.pop(k, None) for k in BOOTSTRAP_FIELDS}
            stream = bool(body.get("stream"))
            if stream and self.path == "/generate":
                raise ValueError("stream: not served on /generate here")
            if self.path == "/generate":
                tokens = body.get("input_ids") or \
                    self.engine.model.encode(body["text"])
                max_tokens = int(body.get("sampling_params", {}).get(
                    "max_new_tokens", 128))
            else:
                tokens, max_tokens, _, _ = self.engine.model.parse(
                    json.dumps(body).encode(), False, self.args.model,
                    self.args.context_length)
            if None in boot.values():
                raise ValueError("%s: a disaggregated server needs the "
                                 "router's bootstrap_host, bootstrap_port "
                                 "and bootstrap_room" % self.args.
                                 disaggregation_mode)
        except ParseError as ex:
            return self.reply(ex.status, error_body(ex.status, ex.message))
        except (ValueError, KeyError, TypeError) as ex:
            return self.reply(400, error_body(400, str(ex)))
        if self.engine.error is not None:
            return self.reply(503, error_body(503, str(self.engine.error)))
        job = Job(int(boot["bootstrap_room"]), tokens, max_tokens,
                  boot["bootstrap_host"])
        job.bootstrap_port = int(boot["bootstrap_port"])
        self.engine.submit(job, self.args.request_timeout)
        if job.error or not job.out:
            return self.reply(500, error_body(
                500, "room %d: %s" % (job.bootstrap_room, job.error)))
        text = self.engine.model.text(job.out)
        if self.path == "/generate":
            return self.reply(200, {"text": text, "output_ids": job.out,
                                    "meta_info": {
                                        "prompt_tokens": len(tokens),
                                        "completion_tokens": len(job.out),
                                        "finish_reason": {
                                            "type": "length",
                                            "length": len(job.out)}}})
        meta = {"id": "cmpl-" + uuid.uuid4().hex, "object": "text_completion",
                "created": int(time.time()), "model": self.args.model}
        if stream:
            return self.stream(meta, job.out)
        self.reply(200, dict(meta, **{
            "choices": [{"index": 0, "text": text, "logprobs": None,
                         "finish_reason": "length"}],
            "usage": {"prompt_tokens": len(tokens),
                      "completion_tokens": len(job.out),
                      "total_tokens": len(tokens) + len(job.out)}}))

    def stream(self, meta, out):
        """The tokens as server-sent events, a word each, once the
        request is done (the harness decodes in one go)."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        words = [self.engine.model.word(t) for t in out]
        chunks = [(w if i == 0 else " " + w, None)
                  for i, w in enumerate(words)] + [("", "length")]
        for text, finish in chunks:
            self.wfile.write(b"data: " + json.dumps(dict(meta, choices=[{
                "index": 0, "text": text, "logprobs": None,
                "finish_reason": finish}])).encode() + b"\n\n")
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--model-path", "--model", dest="model", default="tiny")
    ap.add_argument("--disaggregation-mode", required=True,
                    choices=("prefill", "decode"))
    ap.add_argument("--disaggregation-bootstrap-port", type=int,
                    default=8998)
    ap.add_argument("--context-length", type=int, default=4096)
    ap.add_argument("--pages", type=int, default=1024)
    ap.add_argument("--request-timeout", type=float, default=600)
    a = ap.parse_args(argv)
    engine = Engine(a.disaggregation_mode, a.disaggregation_bootstrap_port,
                    a.model, a.pages)
    Handler.engine, Handler.args = engine, a
    srv = ThreadingHTTPServer((a.host, a.port), Handler)
    srv.daemon_threads = True
    a.port = srv.server_address[1]
    print("mini_sglang: %s listening on http://%s:%d"
          % (a.disaggregation_mode, a.host, a.port), file=sys.stderr,
          flush=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    while not stop.wait(0.2) and engine.error is None:
        pass
    if engine.error is not None:
        print("mini_sglang: engine failed: %r" % engine.error,
              file=sys.stderr, flush=True)
    srv.shutdown()
    engine.close()
    return 1 if engine.error is not None else 0


if __name__ == "__main__":
    sys.exit(main())
