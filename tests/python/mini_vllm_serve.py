"""mini_vllm behind an OpenAI-compatible HTTP server, the way `vllm serve`
puts vLLM behind one, so proxies (pdx-proxy, vLLM's toy_proxy_server.py)
drive it as they would drive vLLM:

    python3 mini_vllm_serve.py --port 0 --role prefill \\
        --kv-transfer-config '{"kv_connector":"PdxConnector",
                               "kv_connector_module_path":"pdx.vllm",
                               "kv_role":"kv_producer"}'

Routes: POST /v1/completions and /v1/chat/completions (streamed or not;
kv_transfer_params read from the body and, not streamed, answered as
vLLM answers them), GET /v1/models, /health, /v1/pdx/info (as
pdx-engine answers it, so pdx-proxy can learn the agent) and /metrics
(the KV pool and the queue under pdx-engine's names, and the transfers
the worker's connector counts, for tests). Request bodies
are read by pdx-engine's own parser (mini_model.Model.parse), so the
same prompt gives the same tokens, and the same text, as pdx-engine.
Logs `listening on http://H:P` once it listens (--port 0 picks one).
VLLM_KV_CACHE_LAYOUT (NHD or HND) is vLLM's: the order inside a block,
before the connector's.
"""
import argparse
import json
import os
import signal
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from mini_model import ParseError
from mini_vllm import EngineDead, MiniVllm

REQUEST_TIMEOUT_S = 600


def error_body(status, message, param=None):
    kind = {404: "NotFoundError", 500: "InternalServerError"}.get(
        status, "BadRequestError")
    return {"error": {"message": message, "type": kind, "param": param,
                      "code": status}}


def pdx_info(engine: MiniVllm) -> dict:
    """The connector's agent, when it says: attributes agent and
    peer_addr of its handshake metadata (or of the worker connector),
    else kv_connector_extra_config's "agent"."""
    info = {"role": engine.role, "model": engine.served_model_name,
            "agent": None, "peer_addr": None}
    sources = [engine.worker_connector]
    if engine.handshake_metadata:
        sources = list(engine.handshake_metadata.values()) + sources
    for src in sources:
        for key in ("agent", "peer_addr"):
            if info[key] is None and src is not None:
                info[key] = getattr(src, key, None)
    ktc = engine.vllm_config.kv_transfer_config
    if info["agent"] is None and ktc is not None:
        info["agent"] = ktc.get_from_extra_config("agent", None)
    return info


def metrics(engine: MiniVllm) -> str:
    """Prometheus text: the block pool and the requests as pdx-engine's
    /metrics names them (docs/engine.md), so the same checks read either
    engine; pdx_vllm_transfers_total and pdx_vllm_transfer_bytes_total
    from the worker connector's `stats` Counter, when it keeps one."""
    sched, lab = engine.scheduler, '{model_name="%s"}' % \
        engine.served_model_name
    cap = len(sched.kv.block_pool.blocks) - 1  # less the null block
    free = engine.free_blocks()
    rows = [("pdx_engine_kv_blocks_capacity" + lab, cap),
            ("pdx_engine_kv_blocks_free" + lab, free),
            ("pdx_engine_kv_blocks_used" + lab, cap - free),
            ("pdx_engine_num_requests_running" + lab, len(sched.running)),
            ("pdx_engine_num_requests_waiting" + lab,
             len(sched.waiting) + len(sched.skipped_waiting))]
    stats = dict(getattr(engine.worker_connector, "stats", None) or {})
    for k in ("sent", "received", "failed"):
        rows.append(('pdx_vllm_transfers_total{outcome="%s"}' % k,
                     stats.get(k, 0)))
    for k in ("sent", "received"):
        rows.append(('pdx_vllm_transfer_bytes_total{direction="%s"}' % k,
                     stats.get("bytes_" + k, 0)))
    return "".join("%s %d\n" % r for r in rows)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    engine: MiniVllm = None

    def log_message(self, fmt, *args):
        pass

    def reply(self, status, obj=None, headers=()):
        body = b"" if obj is None else json.dumps(obj).encode()
        self.send_response(status)
        if obj is not None:
            self.send_header("Content-Type", "application/json")
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        e = self.engine
        if self.path == "/health":
            if e.error is not None:
                return self.reply(503, error_body(503, str(e.error)))
            return self.reply(200)
        if self.path == "/v1/models":
            return self.reply(200, {"object": "list", "data": [{
                "id": e.served_model_name, "object": "model",
                "created": int(time.time()), "owned_by": "vllm",
                "max_model_len": e.max_model_len}]})
        if self.path == "/v1/pdx/info":
            return self.reply(200, pdx_info(e))
        if self.path == "/metrics":
            body = metrics(e).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            return self.wfile.write(body)
        self.reply(404, error_body(404, "no route %s" % self.path))

    def do_POST(self):
        chat = self.path == "/v1/chat/completions"
        if not chat and self.path != "/v1/completions":
            return self.reply(404, error_body(404, "no route %s" % self.path))
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        try:
            body = json.loads(raw)
            kvp = body.pop("kv_transfer_params", None) \
                if isinstance(body, dict) else None
            prompt, max_tokens, stream, usage = self.engine.model.parse(
                json.dumps(body).encode(), chat,
                self.engine.served_model_name, self.engine.max_model_len)
        except ValueError as ex:
            return self.reply(400, error_body(400, "invalid JSON: %s" % ex))
        except ParseError as ex:
            return self.reply(ex.status, error_body(ex.status, ex.message,
                                                    ex.param or None))
        ext = self.headers.get("X-Request-Id") or uuid.uuid4().hex
        ext = ("chatcmpl-" if chat else "cmpl-") + ext
        h = self.engine.add_request(prompt, max_tokens, kvp, request_id=ext)
        meta = {"id": ext, "created": int(time.time()),
                "model": self.engine.served_model_name}
        try:
            if stream:
                self.stream(h, chat, meta, usage, len(prompt))
            else:
                self.whole(h, chat, meta, len(prompt))
        except (BrokenPipeError, ConnectionResetError):
            self.engine.abort(h.request_id)
        except (EngineDead, TimeoutError) as ex:
            self.engine.abort(h.request_id)
            self.reply(500, error_body(500, str(ex)))

    def whole(self, h, chat, meta, n_prompt):
        out = h.result(REQUEST_TIMEOUT_S)
        if out.finish_reason in ("error", "abort"):
            return self.reply(500, error_body(
                500, "request %s ended: %s" % (out.external_id,
                                               out.finish_reason)))
        text = self.engine.model.text(out.token_ids)
        choice = {"index": 0, "logprobs": None,
                  "finish_reason": out.finish_reason}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        resp = dict(meta, object="chat.completion" if chat
                    else "text_completion", choices=[choice])
        if out.kv_transfer_params is not None:
            resp["kv_transfer_params"] = out.kv_transfer_params
        resp["usage"] = usage_obj(n_prompt, len(out.token_ids))
        self.reply(200, resp, [("X-Request-Id", meta["id"])])

    def stream(self, h, chat, meta, include_usage, n_prompt):
        obj = "chat.completion.chunk" if chat else "text_completion"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("X-Request-Id", meta["id"])
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        n = 0
        for toks in h.stream(REQUEST_TIMEOUT_S):
            for t in toks:
                word = self.engine.model.word(t)
                text = word if n == 0 else " " + word
                n += 1
                choice = {"index": 0, "logprobs": None,
                          "finish_reason": None}
                if chat:
                    choice["delta"] = ({"role": "assistant", "content": text}
                                       if n == 1 else {"content": text})
                else:
                    choice["text"] = text
                self.sse(dict(meta, object=obj, choices=[choice]))
        out = h.output
        if out.finish_reason in ("error", "abort"):
            self.sse(error_body(500, "request %s ended: %s"
                                % (out.external_id, out.finish_reason)))
        else:
            choice = {"index": 0, "logprobs": None,
                      "finish_reason": out.finish_reason}
            choice.update({"delta": {}} if chat else {"text": ""})
            self.sse(dict(meta, object=obj, choices=[choice]))
        if include_usage:
            self.sse(dict(meta, object=obj, choices=[],
                          usage=usage_obj(n_prompt, n)))
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def sse(self, obj):
        self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
        self.wfile.flush()


def usage_obj(prompt, completion):
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--served-model-name", default=None)
    ap.add_argument("--role", choices=("prefill", "decode", "both"),
                    default="both")
    ap.add_argument("--kv-transfer-config", type=json.loads, default=None)
    ap.add_argument("--num-gpu-blocks-override", "--num-blocks", type=int,
                    default=4096, dest="num_blocks")
    ap.add_argument("--max-model-len", type=int, default=8192)
    ap.add_argument("--kv-layout", default="blocks_first")
    ap.add_argument("--no-enable-prefix-caching", action="store_true")
    ap.add_argument("--async-scheduling", action="store_true")
    a = ap.parse_args(argv)
    engine = MiniVllm(a.kv_transfer_config, role=a.role, model=a.model,
                      num_blocks=a.num_blocks, kv_layout=a.kv_layout,
                      max_model_len=a.max_model_len,
                      enable_prefix_caching=not a.no_enable_prefix_caching,
                      async_scheduling=a.async_scheduling,
                      served_model_name=a.served_model_name,
                      vllm_kv_cache_layout=os.environ.get(
                          "VLLM_KV_CACHE_LAYOUT")).start()
    Handler.engine = engine
    srv = ThreadingHTTPServer((a.host, a.port), Handler)
    srv.daemon_threads = True
    host, port = srv.server_address[:2]
    print("mini_vllm: listening on http://%s:%d" % (host, port),
          file=sys.stderr, flush=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    while not stop.wait(0.2):
        if engine.error is not None:
            print("mini_vllm: engine failed: %r" % engine.error,
                  file=sys.stderr, flush=True)
            break
    srv.shutdown()
    engine.close()
    return 1 if engine.error is not None else 0


if __name__ == "__main__":
    sys.exit(main())
