#!/usr/bin/env python3
"""Requests good and bad, over HTTP, against one server (validate.sh).

  validate.py PORT WHO

WHO is "vllm" to send only the bodies vLLM's rules refuse (and the good
ones), "all" for those too that pdx-engine refuses. A good body must get
200; a bad one 400 with OpenAI's error shape, its "param" the parameter
at fault and its message naming it. Prints each failure; exits 1 on any.
"""
import json
import sys
import urllib.error
import urllib.request

C, CH = "/v1/completions", "/v1/chat/completions"
MSG = [{"role": "user", "content": "hi"}]

GOOD = [
    (C, {"prompt": "Hello", "max_tokens": 3, "temperature": 0.7,
         "top_p": 0.9, "top_k": 5, "min_p": 0.1, "seed": 1, "n": 1,
         "repetition_penalty": 1.0, "logprobs": None, "min_tokens": 3,
         "ignore_eos": True, "user": "u", "presence_penalty": 0}),
    (C, {"prompt": "a b c d", "max_tokens": 2, "truncate_prompt_tokens": 2,
         "stream": False, "stream_options": None, "unknown_field": 1}),
    (CH, {"messages": MSG, "max_completion_tokens": 2, "temperature": 0,
          "logprobs": False, "tool_choice": "none", "stop": [],
          "response_format": {"type": "text"}}),
]

# route, body, param: refused by vLLM's rules, so by pdx-proxy itself
VLLM_BAD = [
    (C, {"prompt": "a", "temperature": -1}, "temperature"),
    (C, {"prompt": "a", "top_p": 0}, "top_p"),
    (C, {"prompt": "a", "top_k": -2}, "top_k"),
    (C, {"prompt": "a", "min_p": 2}, "min_p"),
    (C, {"prompt": "a", "max_tokens": 0}, "max_tokens"),
    (CH, {"messages": MSG, "max_completion_tokens": -1},
     "max_completion_tokens"),
    (C, {"prompt": "a", "max_tokens": 2, "min_tokens": 3}, "min_tokens"),
    (C, {"prompt": "a", "n": 0}, "n"),
    (C, {"prompt": "a", "presence_penalty": 3}, "presence_penalty"),
    (CH, {"messages": MSG, "frequency_penalty": -2.5}, "frequency_penalty"),
    (C, {"prompt": "a", "repetition_penalty": -1}, "repetition_penalty"),
    (C, {"prompt": "a", "seed": "1"}, "seed"),
    (C, {"prompt": "a", "stop": [""]}, "stop"),
    (C, {"prompt": "a", "stream_options": {"include_usage": True}},
     "stream_options"),
    (C, {"prompt": "a", "logprobs": -1}, "logprobs"),
    (CH, {"messages": MSG, "top_logprobs": 2}, "top_logprobs"),
    (C, {"prompt": "a", "suffix": "b"}, "suffix"),
    (C, {"prompt": "a", "logit_bias": {"x": 1}}, "logit_bias"),
    (C, {"prompt": "a", "user": 5}, "user"),
    (C, {"prompt": "a", "echo": "yes"}, "echo"),
    (CH, {"messages": MSG, "tool_choice": "auto"}, "tool_choice"),
    (C, {"prompt": "a", "truncate_prompt_tokens": -2},
     "truncate_prompt_tokens"),
    # pdx: one sequence per request
    (C, {"prompt": "a", "n": 2}, "n"),
    (CH, {"messages": MSG, "n": 4}, "n"),
    (C, {"prompt": "a", "best_of": 3}, "best_of"),
    (C, {"prompt": ["a", "b"]}, "prompt"),
]

# vLLM serves these; pdx-engine does not implement them
ENGINE_BAD = [
    (C, {"prompt": "a", "logprobs": 5}, "logprobs"),
    (CH, {"messages": MSG, "logprobs": True, "top_logprobs": 2},
     "logprobs"),
    (C, {"prompt": "a", "echo": True}, "echo"),
    (C, {"prompt": "a", "stop": ["x"]}, "stop"),
    (CH, {"messages": MSG, "stop": "x"}, "stop"),
    (C, {"prompt": "a", "presence_penalty": 1}, "presence_penalty"),
    (C, {"prompt": "a", "logit_bias": {"5": -100}}, "logit_bias"),
    (C, {"prompt": "a", "use_beam_search": True}, "use_beam_search"),
    (CH, {"messages": MSG, "response_format": {"type": "json_object"}},
     "response_format"),
    (CH, {"messages": MSG, "tools": [
        {"type": "function", "function": {"name": "f"}}]}, "tools"),
]


def post(port, route, body):
    req = urllib.request.Request(
        "http://127.0.0.1:%s%s" % (port, route),
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def main():
    port, who = sys.argv[1], sys.argv[2]
    bad = VLLM_BAD + (ENGINE_BAD if who == "all" else [])
    failures = 0
    for route, body in GOOD:
        status, raw = post(port, route, body)
        if status != 200:
            print("%s %s: HTTP %d, want 200: %s" %
                  (route, json.dumps(body), status, raw[:300]))
            failures += 1
    for route, body, param in bad:
        status, raw = post(port, route, body)
        try:
            err = json.loads(raw)["error"]
            ok = (status == 400 and err["param"] == param and
                  param in err["message"] and err["code"] == 400 and
                  err["type"] == "invalid_request_error")
        except (ValueError, KeyError, TypeError):
            ok = False
        if not ok:
            print("%s %s: HTTP %d %s, want 400 naming %s" %
                  (route, json.dumps(body), status, raw[:300], param))
            failures += 1
    print("%s: %d requests, %d failed" %
          (who, len(GOOD) + len(bad), failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
