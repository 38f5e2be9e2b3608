"""Starts vLLM's toy_proxy_server.py, unchanged, on Debian 12's FastAPI.

usage: toy_proxy_run.py PATH/toy_proxy_server.py [its flags...]

FastAPI 0.92 predates FastAPI(lifespan=...) (0.93): it keeps the argument
unused, so the proxy's clients would never be made. This hands the same
lifespan to the router, sets the module's global_args from the flags as
its __main__ does, and runs uvicorn as it does. Exits 77 (a skip) when
fastapi, uvicorn or httpx is missing."""
import importlib.util
import sys

try:
    import fastapi  # noqa: F401
    import httpx  # noqa: F401
    import uvicorn
except ImportError as e:
    print(f"# skip: {e}", file=sys.stderr)
    sys.exit(77)

path = sys.argv[1]
sys.argv = [path] + sys.argv[2:]
spec = importlib.util.spec_from_file_location("toy_proxy_server", path)
toy = importlib.util.module_from_spec(spec)
spec.loader.exec_module(toy)
toy.app.router.lifespan_context = toy.lifespan
toy.global_args = toy.parse_args()
uvicorn.run(toy.app, host=toy.global_args.host, port=toy.global_args.port,
            log_level="warning")
