#!/usr/bin/python3
"""py_sglang_pdx_engine: an SGLang prefill server with pdx.sglang feeding a
pdx-engine decode instance (SGLang harness -> pdx-engine), and a pdx-engine
prefill instance feeding an SGLang decode server (and back). The two speak
different hand-offs: SGLang's bootstrap (host, port, room) on one side,
pdx-engine's kv_transfer_params on the other. What joins them is what a
router in front of both would do, and no more: the prefill server gets
the request with the bootstrap fields, as SGLang's router sends it; the
decode engine gets kv_transfer_params naming the transfer pdx.sglang
makes of that room (pdx.sglang.manager.xfer_id) and the agent the
prefill server's bootstrap server gives for rank 0. The prefill side's
send is open: the decode engine's agent claims it by that id. Back: a
bootstrap server of pdx.sglang's kind, run here as such a router would,
names pdx-engine's agent (GET /v1/pdx/info) as prefill rank 0 with the
layout its pool has in SGLang's terms; the SGLang decode server asks it,
and pdx-engine's prefill (kv_transfer_params with the room's transfer
id, an open send) is claimed by the decode server's agent. Checked: each
completion's text equals a colocated pdx-engine's (the decode side checks
the received KV of every position against its prompt and decodes from
it, starting with the prefill side's first token), and the prefill side
answers too. PDX_SGLANG_TOKEN describes SGLang's pool with pdx-engine's
tiny model's heads, so that the agents' layouts match.

    test_sglang_pdx_engine.py PDX-ENGINE PDX-AGENT
"""
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
import urllib.request

from pdx.sglang import bootstrap
from pdx.sglang.manager import xfer_id
from pdx.vllm.agent import AgentProcess
from rig import free_port, start_server
from test_sglang_http import PROMPTS, completion, post, text

HERE = os.path.dirname(os.path.abspath(__file__))


def prefill_rank0(boot, bound_s=20):
    """The bootstrap server's registration of prefill rank 0 (its agent's
    peer address), once every rank registered."""
    end = time.monotonic() + bound_s
    while time.monotonic() < end:
        reg = bootstrap.query("127.0.0.1:%d" % boot, 0, 0, 0)
        if reg is not None:
            return reg
        time.sleep(0.05)
    raise RuntimeError("no prefill rank 0 at the bootstrap server")


def back(engine_bin, agent_bin, spawn, colocated):
    """pdx-engine prefill -> SGLang decode, through a bootstrap server
    that names pdx-engine's agent."""
    agent = AgentProcess(agent_bin)
    boot = bootstrap.PdxKVBootstrapServer("127.0.0.1", free_port())
    try:
        prefill = spawn("engine_prefill", [
            engine_bin, "--port", "0", "--model", "tiny", "--time-scale",
            "0", "--role", "prefill", "--agent", agent.engine_addr])
        decode = spawn("sglang_decode", [
            sys.executable, os.path.join(HERE, "mini_sglang_serve.py"),
            "--port", "0", "--request-timeout", "20",
            "--disaggregation-mode", "decode"])
        s, info = post_get(prefill + "/v1/pdx/info")
        assert s == 200, (s, info)
        # tiny: 4 layers of K and V, pages of 4 tokens of 2 x 16 fp16s
        bootstrap.register("127.0.0.1:%d" % boot.port, dict(
            attn_tp_size=1, attn_tp_rank=0, pp_size=1, pp_rank=0,
            dp_size=1, dp_rank=0, peer_addr=json.loads(info)["peer_addr"],
            shape=dict(tensors=2, layers=4, page_size=4,
                       item_lens=[4 * 2 * 16 * 2] * 4)))
        for prompt, n in PROMPTS:
            room = random.getrandbits(63)
            answer = {}

            def ask_prefill():
                answer["p"] = post(prefill + "/v1/completions", dict(
                    completion(prompt, 1), kv_transfer_params={
                        "do_remote_decode": True,
                        "xfer_id": xfer_id(room, 0).hex}))
            t = threading.Thread(target=ask_prefill)
            t.start()
            s, got = post(decode + "/v1/completions", dict(
                completion(prompt, n), bootstrap_host="127.0.0.1",
                bootstrap_port=boot.port, bootstrap_room=room))
            t.join(30)
            _, want = post(colocated + "/v1/completions",
                           completion(prompt, n))
            assert s == 200, ("sglang decode", prompt, s, got)
            assert text(got) == text(want), (prompt, text(got), text(want))
            assert answer.get("p", (0,))[0] == 200, ("prefill", answer)
            print("ok   pdx-engine prefill -> SGLang decode: %r" % (prompt,))
    finally:
        boot.close()
        agent.stop()


def post_get(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read().decode()


def main():
    engine_bin, agent_bin = sys.argv[1:3]
    # pdx-engine's tiny model, token by token: 2 KV heads of 16 fp16s
    os.environ.update(PDX_SGLANG_AGENT_BIN=agent_bin, PDX_SGLANG_TOKEN="2,16,2",
                      PDX_SGLANG_XFER_TIMEOUT_MS="8000",
                      UCX_TLS="sm,self", UCX_WARN_UNUSED_ENV_VARS="n")
    tmp = tempfile.mkdtemp(prefix="pdx-sgle-")
    procs, agent = {}, None

    def spawn(name, cmd):
        with open(os.path.join(tmp, name + ".log"), "w") as log:
            procs[name], url = start_server(cmd, log, new_session=True)
        return url

    boot = free_port()
    try:
        colocated = spawn("colocated", [engine_bin, "--port", "0", "--model",
                                        "tiny", "--time-scale", "0"])
        agent = AgentProcess(agent_bin)
        decode = spawn("decode", [engine_bin, "--port", "0", "--model", "tiny",
                                  "--time-scale", "0", "--role", "decode",
                                  "--agent", agent.engine_addr])
        prefill = spawn("prefill", [
            sys.executable, os.path.join(HERE, "mini_sglang_serve.py"),
            "--port", "0", "--request-timeout", "20",
            "--disaggregation-mode", "prefill",
            "--disaggregation-bootstrap-port", str(boot)])
        peer = prefill_rank0(boot)["peer_addr"]
        for prompt, n in PROMPTS:
            room = random.getrandbits(63)
            answer = {}

            def ask_prefill():
                answer["p"] = post(prefill + "/v1/completions", dict(
                    completion(prompt, n), bootstrap_host="127.0.0.1",
                    bootstrap_port=boot, bootstrap_room=room))
            t = threading.Thread(target=ask_prefill)
            t.start()
            s, got = post(decode + "/v1/completions", dict(
                completion(prompt, n), kv_transfer_params={
                    "do_remote_prefill": True,
                    "xfer_id": xfer_id(room, 0).hex,
                    "remote_agent": peer}))
            t.join(30)
            s_want, want = post(colocated + "/v1/completions",
                                completion(prompt, n))
            assert s == 200, ("decode", prompt, s, got)
            assert s_want == 200, (s_want, want)
            assert text(got) == text(want), (prompt, text(got), text(want))
            assert answer.get("p", (0,))[0] == 200, ("prefill", answer)
            print("ok   SGLang prefill -> pdx-engine decode: %r" % (prompt,))
        back(engine_bin, agent_bin, spawn, colocated)
        print("ok")
    finally:
        for p in procs.values():
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(10)
            except (ProcessLookupError, OSError):
                pass
        if agent is not None:
            agent.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
