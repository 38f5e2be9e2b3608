#!/usr/bin/python3
"""Writes the fuzz targets' seed corpora (tests/fuzz/corpus/<target>/) and
dictionaries (tests/fuzz/<target>.dict): small valid messages of each kind
(docs/protocol.md, docs/engine.md). Deterministic; rerun after changing
it. Crash inputs kept as regressions (corpus/<target>/crash-*) are not
touched.
    tests/fuzz/gen_corpus.py
"""
import json
import os
import struct

import msgpack

HERE = os.path.dirname(os.path.abspath(__file__))
PEER = "tcp://peer.fuzz:7000"  # agent_harness.h FA_PEER
HOST = "fuzzhost"
X1 = bytes(range(16))
X2 = bytes(range(16, 32))


def layout(layers=4, tensors=2, blocks=64, order="NHD", bb=64, kv_heads=2):
    return {
        "layers": layers, "tensors": tensors, "blocks": blocks,
        "block_tokens": 4, "kv_heads": kv_heads, "head_dim": 4,
        "dtype_bytes": 2,
        "order": order,
        "bases": [[[0, (l * tensors + t) * blocks * bb]
                   for t in range(tensors)] for l in range(layers)],
        "strides": [bb] * layers,
    }


def fnv_compat(l):
    h = 0xcbf29ce484222325
    for k in ("layers", "tensors", "block_tokens", "kv_heads", "head_dim",
              "dtype_bytes"):
        v = l[k]
        for i in range(8):
            h ^= (v >> (8 * i)) & 0xff
            h = (h * 0x100000001b3) & 0xffffffffffffffff
    v = 1 if l["order"] == "HND" else 0
    for i in range(8):
        h ^= (v >> (8 * i)) & 0xff
        h = (h * 0x100000001b3) & 0xffffffffffffffff
    return h


def mp(o):
    return msgpack.packb(o, use_bin_type=True)


def rec(ch, payload=b""):
    return struct.pack("<BH", ch, len(payload)) + payload


def eng(o):
    return rec(0, mp(o))


def peer(o):
    o = dict(o)
    o.setdefault("from", PEER)
    return rec(1, mp(o))


def am(xfer, layer, tensor, index, payload, rndv=False):
    hdr = xfer + struct.pack("<HBBI", layer, tensor, 0, index)
    return rec(3 if rndv else 2, hdr + payload)


REGISTER = {"op": "register", "v": 1, "layout": layout(),
            "regions": [{"type": "shm", "name": "/fuzz-kv",
                         "size": 4 * 2 * 64 * 64}]}


def hello(op="hello", instance=7, lay=None, host=HOST, shm=True,
          name="/fuzz-peer", size=4 * 2 * 64 * 64):
    lay = lay or layout()
    return {"op": op, "from": PEER, "v": 3, "instance": instance,
            "host": host, "shm": shm, "compat": fnv_compat(lay),
            "layout": lay, "ucx": b"addr",
            "regions": [{"name": name, "addr": 0x100000, "size": size,
                         "rkey": b"rk"}]}


def send(x=X1, blocks=(0, 1, 2, 3), **kw):
    return {"op": "send", "xfer": x, "peer": PEER, "blocks": list(blocks),
            **kw}


def recv(x=X1, blocks=(4, 5, 6, 7), **kw):
    return {"op": "recv", "xfer": x, "peer": PEER, "blocks": list(blocks),
            **kw}


def layers_done(x=X1, n=4):
    return b"".join(eng({"op": "layer_done", "layer": l, "xfers": [x]})
                    for l in range(n))


def want(x=X1, blocks=(8, 9, 10, 11), skip=0):
    return peer({"op": "want", "xfer": x, "blocks": list(blocks),
                 "skip": skip})


def leg_id(x, i, j):
    """The id of the TP leg from prefill rank i to decode rank j of x
    (docs/protocol.md, "TP legs")."""
    v = int.from_bytes(x[12:], "big") ^ (1 << 31 | i << 16 | j)
    return x[:12] + v.to_bytes(4, "big")


def done(x=X1, nbytes=2048, am_bytes=0, first_token=5):
    return peer({"op": "done", "xfer": x, "bytes": nbytes,
                 "am_bytes": am_bytes, "first_token": first_token})


def engine_link():
    reg = eng(REGISTER)
    hi = peer(hello("hello_ack"))
    c = {}
    c["register"] = b"\0" + reg
    c["register_v2"] = b"\0" + eng({**REGISTER, "v": 2})
    c["register_mla_hnd"] = b"\0" + eng({**REGISTER, "layout": layout(
        tensors=1, order="HND")})
    c["register_outside"] = b"\0" + eng({**REGISTER, "regions": [
        {"type": "shm", "name": "/fuzz-kv", "size": 4096}]})
    c["register_cuda"] = b"\0" + eng({**REGISTER, "regions": [
        {"type": "cuda", "name": "x", "size": 4096}]})
    c["unregistered_send"] = b"\0" + eng(send())
    c["unknown_op"] = b"\0" + eng({"op": "frobnicate"})
    c["not_a_map"] = b"\0" + rec(0, mp([1, 2, 3]))
    for path in range(4):
        c["send_flow_%d" % path] = bytes([path]) + reg + eng(send()) + hi + \
            want() + eng({"op": "token", "xfer": X1, "token": 42}) + \
            layers_done()
    c["send_before_want"] = b"\2" + reg + eng(send(timeout_ms=500)) + \
        layers_done() + hi + want()
    c["send_scattered"] = b"\0" + reg + eng(send(blocks=(9, 3, 4, 63))) + \
        hi + want(blocks=(1, 2, 40, 41), skip=1) + layers_done()
    c["recv_flow"] = b"\3" + reg + eng(recv(skip_tokens=4)) + hi + \
        am(X1, 0, 0, 1, b"k" * 64) + am(X1, 0, 1, 2, b"v" * 128, True) + \
        done(am_bytes=192)
    c["recv_skip_all"] = b"\0" + reg + eng(recv(skip_tokens=1000))
    c["abort_announced"] = b"\0" + reg + eng(send()) + \
        eng({"op": "abort", "xfer": X1})
    c["abort_unannounced"] = b"\0" + reg + \
        eng({"op": "abort", "xfer": X2, "peer": PEER})
    c["duplicate_xfer"] = b"\0" + reg + eng(send()) + eng(recv())
    c["timeout"] = b"\0" + reg + eng(send()) + hi + rec(4)
    c["peer_dies"] = b"\2" + reg + eng(send()) + hi + want() + \
        eng({"op": "layer_done", "layer": 0, "xfers": [X1]}) + rec(5)
    c["reregister"] = b"\0" + reg + eng(recv()) + reg
    c["duplicate_blocks"] = b"\0" + reg + eng(recv(blocks=(4, 5, 4)))
    c["send_skip_all"] = b"\1" + reg + eng(send()) + hi + \
        want(skip=4) + eng({"op": "token", "xfer": X1, "token": 9}) + \
        layers_done()
    # TP: we are prefill rank 0 of 2 (2 of 4 heads), the peer decode
    # rank 0 of 1 (all 4)
    reg_tp = eng({**REGISTER, "tp": {"rank": 0, "size": 2}})
    hi_d1 = peer({**hello("hello_ack", lay=layout(kv_heads=4, bb=128),
                          size=4 * 2 * 64 * 128),
                  "tp": {"rank": 0, "size": 1}})
    leg = peer({"op": "want", "xfer": leg_id(X1, 0, 0), "of": X1,
                "blocks": [8, 9, 10, 11], "skip": 0})
    for path in range(4):
        c["tp_send_leg_%d" % path] = bytes([path]) + reg_tp + \
            eng(send(peer=None)) + hi_d1 + leg + \
            eng({"op": "token", "xfer": X1, "token": 42}) + layers_done()
    c["tp_want_before_send"] = b"\0" + reg_tp + hi_d1 + leg + \
        eng(send(peer=None)) + layers_done()
    c["tp_abort_before_want"] = b"\0" + reg_tp + eng(send(peer=None)) + \
        hi_d1 + peer({"op": "abort", "xfer": leg_id(X1, 0, 0),
                      "reason": "aborted by engine"})
    c["tp_register_size_3"] = b"\0" + eng({**REGISTER, "tp": {
        "rank": 0, "size": 3}})
    # we are decode rank 0 of 1, the peers prefill ranks of 2
    hi_p2 = peer({**hello("hello_ack", lay=layout(kv_heads=1, bb=32),
                          size=4 * 2 * 64 * 32),
                  "tp": {"rank": 0, "size": 2}})
    c["tp_recv_legs"] = b"\0" + reg + \
        eng(recv(peers=[PEER, "tcp://peer2.fuzz:7000"])) + hi_p2 + \
        done(leg_id(X1, 0, 0), nbytes=1024)
    c["tp_recv_peers_3"] = b"\0" + reg + eng(recv(peers=[PEER] * 3))
    return c


def peer_link():
    c = {}
    for path in range(4):
        c["want_then_send_%d" % path] = bytes([path]) + want() + \
            eng(send()) + layers_done()
    c["send_then_want"] = b"\0" + eng(send()) + layers_done() + want()
    c["want_bad_block"] = b"\0" + want(blocks=(1, 64))
    c["want_wrong_count"] = b"\2" + eng(send()) + want(blocks=(1,)) + \
        layers_done(n=1)
    c["done_unknown"] = b"\0" + done(X2)
    c["recv_am"] = b"\3" + eng(recv()) + am(X1, 1, 0, 0, b"a" * 64) + \
        am(X1, 3, 1, 2, b"b" * 128, True) + done(am_bytes=192)
    c["recv_put"] = b"\2" + eng(recv()) + done(nbytes=4096)
    c["am_bad_index"] = b"\0" + eng(recv()) + am(X1, 0, 0, 3, b"c" * 128)
    c["hello_again"] = b"\0" + peer(hello())
    c["hello_restart"] = b"\0" + eng(send()) + peer(hello(instance=8))
    c["hello_other_host"] = b"\0" + peer(hello(instance=9, host="other"))
    # the harness's worker address (agent_harness.c), NUL included
    ours = 0xcbf29ce484222325
    for b in b"fuzz-worker-address\0":
        ours = ((ours ^ b) * 0x100000001b3) & 0xffffffffffffffff
    c["hello_ucx_ep"] = b"\0" + peer({**hello(instance=9, host="other"),
                                     "ucx_ep": {"worker": ours, "sn": 3}})
    c["hello_ucx_ep_far"] = b"\0" + eng(send()) + peer(
        {**hello(instance=9, host="other"),
         "ucx_ep": {"worker": ours, "sn": 65}})
    c["hello_mismatch"] = b"\0" + eng(recv()) + peer(hello(
        instance=9, lay=layout(tensors=1)))
    c["hello_hnd"] = b"\0" + peer(hello(instance=9, lay=layout(
        order="HND")))
    c["hello_small_region"] = b"\1" + peer(hello(instance=9, size=4096)) + \
        eng(send()) + want() + layers_done()
    c["hello_nack"] = b"\0" + eng(send()) + peer({
        "op": "hello_nack", "reason": "layout differs: kv_heads 8 != 4"})
    c["hello_nack_no_engine"] = b"\0" + eng(send()) + peer({
        "op": "hello_nack", "reason": "no engine registered at " + PEER,
        "no_engine": True})
    c["abort"] = b"\0" + eng(recv()) + peer({
        "op": "abort", "xfer": X1, "reason": "aborted by engine"})
    c["error_before_announce"] = b"\0" + want() + peer({
        "op": "error", "xfer": X1, "reason": "unknown transfer"}) + \
        eng(send())
    c["no_handshake"] = b"\0" + rec(1, mp({
        "op": "want", "from": "tcp://stranger:1", "xfer": X1,
        "blocks": [1], "skip": 0}))
    c["timers"] = b"\0" + want() + eng(recv(X2)) + rec(4)
    c["gone"] = b"\1" + eng(send()) + want() + \
        peer({"op": "gone", "instance": 7}) + layers_done()
    c["gone_other"] = b"\0" + eng(recv()) + \
        peer({"op": "gone", "instance": 9})
    return c


def layout_seeds():
    c = {}
    c["kv"] = b"\x08" + mp(layout(layers=2, bb=64))
    c["mla"] = b"\x04" + mp(layout(layers=3, tensors=1))
    c["hnd"] = b"\x10" + mp(layout(layers=2, order="HND"))
    c["big"] = b"\xff" + mp(layout(layers=32, blocks=1000, bb=4096))
    l = layout(layers=2)
    l["strides"] = [16, 64]
    c["small_stride"] = b"\x08" + mp(l)
    l = layout(layers=2)
    l["bases"][1][1] = [3, 0]
    c["region3"] = b"\x03" + mp(l)
    return c


def engine_client():
    def frame(o, plen=64):
        b = mp(o)
        return struct.pack("<H", len(b)) + bytes([plen]) + b
    ev = {"op": "event", "xfer": X1, "kind": "sent", "status": 0,
          "reason": "", "bytes": 4096, "t_first": 1, "t_last": 2,
          "first_token": -1}
    c = {}
    c["sent"] = frame(ev)
    c["received"] = frame({**ev, "kind": "received", "first_token": 17})
    c["failed"] = frame({**ev, "kind": "failed", "status": -3,
                         "reason": "timed out"})
    c["registered"] = frame({"op": "registered", "peer": PEER})
    c["registered_short"] = frame({"op": "registered", "peer": PEER}, 8)
    c["error"] = frame({"op": "error", "status": -2, "reason": "bad layout"})
    c["queue"] = b"".join(frame({**ev, "xfer": bytes([i] * 16)})
                          for i in range(20)) + frame(
        {"op": "registered", "peer": PEER})
    return c


def openai():
    kv_d = {"do_remote_prefill": True, "xfer_id": X1.hex(),
            "remote_agent": PEER, "first_token": 5,
            "on_failure": "recompute"}
    kv_p = {"do_remote_decode": True, "xfer_id": X2.hex(),
            "remote_agent": PEER, "metaserver": "http://proxy:8000/cb"}
    bodies = {
        "completion": (0, {"model": "fuzz-model", "prompt": "hello world",
                           "max_tokens": 4}),
        "ids": (0, {"prompt": [1, 2, 3, 200], "max_tokens": 2,
                    "stream": True,
                    "stream_options": {"include_usage": True}}),
        "kv_decode": (0, {"prompt": "abc", "kv_transfer_params": kv_d}),
        "kv_prefill": (0, {"prompt": "abc", "max_tokens": 1,
                           "kv_transfer_params": kv_p}),
        "chat": (1, {"model": "fuzz-model", "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            "max_completion_tokens": 3, "n": 1}),
        "wrong_model": (0, {"model": "gpt-\u00e9\u00e9", "prompt": "x"}),
        "list_of_prompts": (0, {"prompt": ["a", "b"]}),
        "list_of_one": (0, {"prompt": [[1, 2, 3]], "max_tokens": 2}),
        "nul_in_text": (1, {"messages": [{"role": "user",
                                          "content": "a\u0000b"}],
                            "user": "x\u0000"}),
        "sampling": (0, {"prompt": "a b", "temperature": 0.7, "top_p": 0.9,
                         "top_k": -1, "seed": 3, "min_tokens": 1,
                         "repetition_penalty": 1.0, "logprobs": None,
                         "truncate_prompt_tokens": 2}),
        "refused": (0, {"prompt": "a", "logprobs": 5, "stop": ["x"]}),
        "bad_range": (0, {"prompt": "a", "temperature": -1}),
        "chat_open": (1, {"messages": [{"role": "user", "content": "x"}],
                          "continue_final_message": True,
                          "tool_choice": "none", "stream": True,
                          "stream_options": {}}),
    }
    c = {}
    for name, (chat, body) in bodies.items():
        # bits: chat, vocab 32000, max_model_len 2048
        c[name] = bytes([chat | 2 << 1 | 2 << 3]) + \
            json.dumps(body).encode()
    c["bad_json"] = b"\x14" + b'{"prompt": "a",'
    # Python's json.loads skips a UTF-8 byte order mark: so does pdx
    c["bom"] = b"\x14" + b"\xef\xbb\xbf" + b'{"prompt": ["a b"]}'
    return c


def kv_params():
    c = {}
    c["decode"] = {"do_remote_prefill": True, "xfer_id": X1.hex(),
                   "remote_agent": PEER, "first_token": 5,
                   "on_failure": "fail"}
    c["prefill"] = {"do_remote_decode": True, "xfer_id": X2.hex().upper(),
                    "remote_agent": PEER,
                    "metaserver": "http://proxy:8000/v1/metaserver"}
    # vLLM's example proxies: the prefill side mints the id
    c["vllm_prefill"] = {"do_remote_decode": True, "do_remote_prefill": False,
                         "remote_engine_id": None, "remote_block_ids": None,
                         "remote_host": None, "remote_port": None}
    c["none"] = {"do_remote_prefill": False}
    c["both"] = {"do_remote_prefill": True, "do_remote_decode": True}
    c["null"] = None
    return {k: json.dumps(v).encode() for k, v in c.items()}


def proxy_request():
    c = {}
    c["completion"] = {"model": "m", "prompt": "hello", "max_tokens": 8,
                       "stream": True,
                       "stream_options": {"include_usage": True}}
    c["ids"] = {"prompt": [1, 2, 3, 4, 5], "max_tokens": 3}
    c["batch"] = {"prompt": [[1, 2], [3]], "min_tokens": 2}
    c["chat"] = {"messages": [{"role": "user", "content": "hi"},
                              {"role": "assistant", "content": [
                                  {"type": "text", "text": "yo"}]}],
                 "max_completion_tokens": 9}
    c["own_kv"] = {"prompt": "x", "kv_transfer_params": {
        "xfer_id": X1.hex(), "remote_agent": "tcp://d2:7000"}}
    c["bad_top_p"] = {"prompt": "x", "top_p": 0, "n": 2}
    c["tools"] = {"messages": [{"role": "user", "content": "x"}],
                  "tools": [{"type": "function", "function": {"name": "f"}}],
                  "tool_choice": {"function": {"name": "g"}}}
    c["list_of_one"] = {"prompt": ["a\u0000b"], "max_tokens": 2}
    return {k: bytes([i]) + json.dumps(v).encode()
            for i, (k, v) in enumerate(c.items())}


def sse():
    def chunk(text, chat):
        if chat:
            return {"choices": [{"index": 0, "delta": {"content": text}}]}
        return {"choices": [{"index": 0, "text": text}]}
    c = {}
    for chat in (0, 1):
        s = "".join("data: %s\n\n" % json.dumps(chunk(t, chat))
                    for t in ("Hel", "lo", ""))
        s += 'data: {"choices": [], "usage": {"prompt_tokens": 3, ' \
             '"completion_tokens": 3}}\n\n'
        s += "data: [DONE]\n\n"
        c["stream_%d" % chat] = bytes([chat | 2]) + s.encode()
    c["crlf_comments"] = b"\x04" + \
        b": keep-alive\r\nevent: x\r\ndata: {\"a\":\r\ndata: 1}\r\n\r\n" \
        b"data: [DONE]"
    c["no_final_blank"] = b"\x06" + b"data: {\"choices\":[{\"text\":\"x\"}]}"
    return c


def proxy_notify():
    def note(x, kind, agent, status=0):
        return rec(0, mp({"op": "xfer_event", "agent": agent, "peer": PEER,
                          "xfer": x, "kind": kind, "status": status,
                          "reason": "" if not status else "timed out",
                          "bytes": 4096, "t_first": 1, "t_last": 2,
                          "first_token": -1}))
    start = rec(1, X1.hex().encode())
    c = {}
    c["sent_received"] = start + note(X1, "sent", "tcp://p1:7000") + \
        note(X1, "received", "tcp://d1:7000")
    c["failed_both"] = start + note(X1, "failed", "tcp://d1:7000", -3) + \
        note(X1, "failed", "tcp://p1:7000", -3)
    c["unknown"] = note(X2, "sent", "tcp://p1:7000")
    c["reused_forgotten"] = start + start + rec(2, X1.hex().encode()) + \
        note(X1, "sent", "tcp://p1:7000")
    c["decode_only"] = rec(1, b"5" + X2.hex().encode()[1:]) + \
        note(X2, "received", "tcp://d1:7000")
    c["not_an_event"] = start + rec(0, mp({"op": "event", "xfer": X1}))
    return c


def write(target, seeds):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    for name in os.listdir(d):
        if not name.startswith(("crash-", "leak-", "timeout-", "oom-")):
            os.remove(os.path.join(d, name))
    for name, data in seeds.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)


def dict_file(target, words):
    with open(os.path.join(HERE, target + ".dict"), "w") as f:
        f.write("# libFuzzer dictionary, written by gen_corpus.py\n")
        for w in words:
            f.write('"%s"\n' % "".join(
                "\\x%02x" % b if b < 0x20 or b > 0x7e or b in b'"\\'
                else chr(b) for b in w))


MP_WORDS = ["op", "v", "layout", "regions", "type", "name", "size", "shm",
            "register", "send", "recv", "layer_done", "token", "abort",
            "xfer", "xfers", "peer", "blocks", "timeout_ms", "skip_tokens",
            "layer", "layers", "tensors", "block_tokens", "kv_heads",
            "head_dim", "dtype_bytes", "order", "NHD", "HND", "bases",
            "strides", "hello", "hello_ack", "hello_nack", "want", "done",
            "error", "from", "instance", "host", "compat", "ucx", "addr",
            "rkey", "skip", "bytes", "am_bytes", "first_token", "reason",
            "/fuzz-kv", "/fuzz-peer", PEER, HOST, "tcp://", "hold", "ping",
            "pong", "tp", "rank", "peers", "of", "stops", "stopped", "gone",
            "no_engine", "ucx_ep", "worker", "sn", "slices", "done_ucx",
            "cuda_ucx"]


def mp_dict():
    words = [mp(w) for w in MP_WORDS]
    words += [mp(X1), mp(True), mp(2 ** 32), mp(-1), b"\xdc\xff\xff",
              b"\xdd\x00\x01\x00\x00", b"\xdf\x00\x01\x00\x00"]
    return words


JSON_WORDS = ["model", "prompt", "messages", "role", "content", "text",
              "type", "max_tokens", "max_completion_tokens", "stream",
              "stream_options", "include_usage", "n", "kv_transfer_params",
              "do_remote_prefill", "do_remote_decode", "xfer_id",
              "remote_agent", "first_token", "on_failure", "recompute",
              "metaserver", "http://", "fuzz-model", "min_tokens",
              "choices", "delta", "usage", "prompt_tokens",
              "completion_tokens", "temperature", "top_p", "top_k", "min_p",
              "seed", "stop", "logprobs", "top_logprobs", "prompt_logprobs",
              "echo", "best_of", "suffix", "logit_bias", "user",
              "presence_penalty", "frequency_penalty", "repetition_penalty",
              "truncate_prompt_tokens", "tools", "tool_choice",
              "continue_final_message", "add_generation_prompt"]


def main():
    write("engine_link", engine_link())
    write("peer_link", peer_link())
    write("layout", layout_seeds())
    write("engine_client", engine_client())
    write("openai", openai())
    write("kv_params", kv_params())
    write("proxy_request", proxy_request())
    write("sse", sse())
    write("proxy_notify", proxy_notify())
    for t in ("engine_link", "peer_link"):
        dict_file(t, mp_dict())
    dict_file("layout", [mp(w) for w in MP_WORDS[20:31]])
    dict_file("proxy_notify", [mp(w) for w in (
        "op", "xfer_event", "agent", "peer", "xfer", "kind", "sent",
        "received", "failed", "status", "reason")] + [mp(X1), X1.hex()
                                                      .encode()])
    dict_file("engine_client", [mp(w) for w in (
        "op", "event", "xfer", "kind", "sent", "received", "failed",
        "status", "reason", "bytes", "t_first", "t_last", "first_token",
        "registered", "error", "peer")])
    words = [('"%s"' % w).encode() for w in JSON_WORDS] + \
        [b"true", b"false", b"null", b"[DONE]", b"\\u00e9", b"\\ud800"]
    for t in ("openai", "kv_params", "proxy_request"):
        dict_file(t, words)
    dict_file("sse", words + [b"data:", b"data: ", b"\r\n", b"\n\n",
                              b": ", b"event:"])


if __name__ == "__main__":
    main()
