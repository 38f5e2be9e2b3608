"""A stand-in for SGLang's mini load balancer (sgl-project/sglang,
python/sglang/srt/disaggregation/mini_lb.py at bda7cc08, which
`python -m sglang_router.launch_router --pd-disaggregation --mini-lb`
runs), reduced to what a request meets, for tests:

    python3 mini_sglang_router.py --port 0 \\
        --prefill http://127.0.0.1:30000 8998 --decode http://127.0.0.1:30001

Per request it picks a prefill and a decode server at random, adds
bootstrap_host (the prefill URL's host, an IPv6 address in brackets),
bootstrap_port (the one given after that URL on the command line: this is
how SGLang's router learns it; None when not given) and bootstrap_room
(random in [0, 2^63)), posts the same body to both at once, waits for
both, and answers with the decode server's status and body. A prefill
post that fails (no connection) fails the request at once with 500, as
mini_lb's asyncio.gather raises. Routes: POST /generate, /v1/completions,
/v1/chat/completions; GET /health. Not streamed. Logs
`listening on http://H:P` once it listens. Nothing here is SGLang's code.
"""
import argparse
import json
import random
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROUTES = ("/generate", "/v1/completions", "/v1/chat/completions")


def post(url, body, timeout):
    """(status, body bytes); an HTTP error status is an answer too."""
    req = urllib.request.Request(url, body,
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def host_of(url):
    h = urllib.parse.urlparse(url).hostname
    return "[%s]" % h if ":" in h else h


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    args = None

    def log_message(self, fmt, *args):
        pass

    def reply(self, status, body=b""):
        self.send_response(status)
        if body:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            return self.reply(200)
        self.reply(404, b'{"detail":"Not Found"}')

    def do_POST(self):
        if self.path not in ROUTES:
            return self.reply(404, b'{"detail":"Not Found"}')
        a = self.args
        body = json.loads(self.rfile.read(
            int(self.headers.get("Content-Length", 0))))
        p_url, p_port = random.choice(a.prefill)
        d_url = random.choice(a.decode)
        body.update(bootstrap_host=host_of(p_url), bootstrap_port=p_port,
                    bootstrap_room=random.randint(0, 2**63 - 1))
        raw = json.dumps(body).encode()
        got = {}

        def leg(name, url):
            try:
                got[name] = post(url + self.path, raw, a.timeout)
            except OSError as e:
                got[name] = e
        threads = [threading.Thread(target=leg, args=(n, u))
                   for n, u in (("prefill", p_url), ("decode", d_url))]
        for t in threads:
            t.start()
        threads[0].join()
        if isinstance(got["prefill"], Exception):
            return self.reply(500, json.dumps({"detail": "prefill %s: %s" % (
                p_url, got["prefill"])}).encode())
        threads[1].join()
        d = got["decode"]
        if isinstance(d, Exception):
            return self.reply(500, json.dumps({"detail": "decode %s: %s" % (
                d_url, d)}).encode())
        self.reply(*d)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--prefill", nargs="+", action="append", default=[],
                    metavar="URL [BOOTSTRAP_PORT]")
    ap.add_argument("--decode", action="append", default=[])
    ap.add_argument("--request-timeout-secs", dest="timeout", type=float,
                    default=1800)
    a = ap.parse_args(argv)
    if not a.prefill or not a.decode:
        ap.error("--prefill and --decode: at least one each")
    a.prefill = [(p[0], int(p[1]) if len(p) > 1 else None)
                 for p in a.prefill]
    Handler.args = a
    srv = ThreadingHTTPServer((a.host, a.port), Handler)
    srv.daemon_threads = True
    print("mini_sglang_router: listening on http://%s:%d"
          % srv.server_address[:2], file=sys.stderr, flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
