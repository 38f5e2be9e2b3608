"""Checks a saved completion against its streamed twin.

usage: sse_check.py WHOLE.json STREAM.sse chat|text MAX_TOKENS

The stream must be "data: {...}\\n\\n" frames, one token per chunk, the
usage chunk (empty choices) and "data: [DONE]" last; its text joined must
equal the non-streamed text, and both must count the same usage."""
import json
import sys

whole_path, stream_path, kind, max_tokens = sys.argv[1:5]
chat = kind == "chat"
max_tokens = int(max_tokens)
whole = json.load(open(whole_path))
raw = open(stream_path).read()

assert raw.endswith("data: [DONE]\n\n"), raw[-100:]
frames = raw.split("\n\n")
assert frames[-1] == "" and frames[-2] == "data: [DONE]", frames[-3:]
chunks = []
for f in frames[:-2]:
    assert f.startswith("data: ") and "\n" not in f, repr(f)
    chunks.append(json.loads(f[6:]))

prefix = "chatcmpl-" if chat else "cmpl-"
obj = "chat.completion" if chat else "text_completion"
assert whole["id"].startswith(prefix), whole["id"]
assert whole["object"] == obj, whole["object"]
assert whole["model"] == "tiny"
c0 = whole["choices"][0]
assert c0["index"] == 0 and c0["finish_reason"] == "length", c0
text = c0["message"]["content"] if chat else c0["text"]
if chat:
    assert c0["message"]["role"] == "assistant"
u = whole["usage"]
assert u["completion_tokens"] == max_tokens, u
assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"], u
assert len(text.split(" ")) == max_tokens, text

tokens, usage = chunks[:-1], chunks[-1]
assert len(tokens) == max_tokens, len(tokens)
pieces = []
for i, c in enumerate(tokens):
    assert c["id"].startswith(prefix) and c["id"] == tokens[0]["id"], c
    assert c["object"] == (obj + ".chunk" if chat else obj), c
    ch = c["choices"]
    assert len(ch) == 1 and ch[0]["index"] == 0, c
    last = i == max_tokens - 1
    assert ch[0]["finish_reason"] == ("length" if last else None), c
    if chat:
        d = ch[0]["delta"]
        assert ("role" in d) == (i == 0), d
        pieces.append(d["content"])
    else:
        pieces.append(ch[0]["text"])
assert "".join(pieces) == text, ("".join(pieces), text)
assert usage["choices"] == [] and usage["usage"] == u, usage
print(text)
