#!/bin/bash
# Disaggregated prefill/decode with two engines, each with its pdx-agent:
# this script plays the proxy. The decode engine's streamed text must equal
# a colocated engine's for the same prompt, in the concurrent flow (D and P
# posted together) and the sequential one (P's kv_transfer_params handed to
# D); a transfer that never comes is recomputed or fails per on_failure;
# a decode request whose kv_transfer_params.first_token is not P's still
# decodes from P's (the one the agents carried with the KV; before, the
# request's: a wrong answer); an xfer_id in flight at D already is a 409
# (the caller's mistake; before, a 500 a proxy counted against D); every
# KV block is free afterwards.
#   pd_concurrent.sh PDX_ENGINE PDX_AGENT
. "$(dirname "$0")/lib.sh"
ENGINE=$1
AGENT=$2

pd_engine_start P prefill --time-scale 0 --max-prefill-tokens 7 --kv-timeout-ms 2000
pd_engine_start D decode --time-scale 0 --kv-timeout-ms 1500
named_engine_start C "$ENGINE" --time-scale 0

# The agent peer addresses from /v1/pdx/info.
for e in P D C; do
	curl -sS "http://127.0.0.1:$(eval echo "\$PORT_$e")/v1/pdx/info" >"$E2E_TMP/info$e" ||
		fail "GET /v1/pdx/info"
done
PEER_P=$(sed -n 's/.*"peer_addr": *"\([^"]*\)".*/\1/p' "$E2E_TMP/infoP")
PEER_D=$(sed -n 's/.*"peer_addr": *"\([^"]*\)".*/\1/p' "$E2E_TMP/infoD")
case "$PEER_P $PEER_D" in tcp://*" "tcp://*) ;; *) fail "peer addresses: $PEER_P $PEER_D" ;; esac
grep -q '"role": *"both"' "$E2E_TMP/infoC" && grep -q '"peer_addr": *null' "$E2E_TMP/infoC" ||
	fail "colocated /v1/pdx/info: $(cat "$E2E_TMP/infoC")"

# (python3 takes ~0.5 s to start here: the checks are batched)

# body PROMPT MAX STREAM [KV_JSON]: prompts hold no JSON specials.
body() {
	printf '{"prompt": "%s", "max_tokens": %s, "stream": %s%s}' "$1" "$2" \
		"$([ "$3" = 1 ] && echo true || echo false)" "${4:+, \"kv_transfer_params\": $4}"
}

T=$E2E_TMP
n=0
for prompt in "Hello, world!" "The quick brown fox jumps over the lazy dog again and again" \
	"a" "$(seq -s ' ' 1 100)"; do
	n=$((n + 1))
	max=$((n * 5))
	to "$PORT_C" "$(body "$prompt" $max 0)" "$T/c$n"

	# concurrent: D (streamed) and P at once, the same fresh xfer id
	x=$(xid)
	echo "$x $PEER_P" >"$T/x$n"
	to "$PORT_D" "$(body "$prompt" $max 1 "$(kv "$x" "$PEER_P" prefill)")" "$T/d$n" &
	dpid=$!
	to "$PORT_P" "$(body "$prompt" $max 0 "$(kv "$x" "$PEER_D" decode)")" "$T/p$n"
	wait $dpid

	# sequential (vLLM's shape): P first, its kv_transfer_params to D
	to "$PORT_P" "$(body "$prompt" $max 0 "$(kv "$(xid)" "$PEER_D" decode)")" "$T/ps$n"
	to "$PORT_D" "$(body "$prompt" $max 0 \
		"$(sed -n 's/.*"kv_transfer_params":\({[^}]*}\).*/\1/p' "$T/ps$n")")" "$T/ds$n"
done

# a transfer that never comes (P never asked): recomputed, or an error
prompt="What happens when the prefill engine never sends anything?"
to "$PORT_C" "$(body "$prompt" 6 0)" "$T/cf"
to "$PORT_D" "$(body "$prompt" 6 1 "$(kv "$(xid)" "$PEER_P" prefill ', "on_failure": "recompute"')")" "$T/dr" &
dpid=$!
to "$PORT_D" "$(body "$prompt" 6 0 "$(kv "$(xid)" "$PEER_P" prefill ', "on_failure": "fail"')")" "$T/df"
wait $dpid
# a client that leaves while its decode waits for KV (aborted), and a
# prefill whose decode side never asks (its blocks held until
# --kv-timeout-ms)
curl -sS -m 0.5 -o /dev/null -d "$(body "$prompt" 6 1 "$(kv "$(xid)" "$PEER_P" prefill)")" \
	"http://127.0.0.1:$PORT_D/v1/completions" 2>/dev/null &
dpid=$!
curl -sS -m 0.5 -o /dev/null -d "$(body "$prompt" 6 0 "$(kv "$(xid)" "$PEER_D" decode)")" \
	"http://127.0.0.1:$PORT_P/v1/completions" 2>/dev/null
wait $dpid
# a first_token that is not P's (P's answer's, one bit flipped): D
# decodes from the one P's agent carried with the KV
prompt="Whose first token is it anyway"
to "$PORT_C" "$(body "$prompt" 6 0)" "$T/cw"
to "$PORT_P" "$(body "$prompt" 6 0 "$(kv "$(xid)" "$PEER_D" decode)")" "$T/pw"
kvw=$(sed -n 's/.*"kv_transfer_params":\({[^}]*}\).*/\1/p' "$T/pw")
ft=$(echo "$kvw" | sed -n 's/.*"first_token":\([0-9]*\).*/\1/p')
[ -n "$ft" ] || fail "P's answer has no first_token: $(cat "$T/pw")"
to "$PORT_D" "$(body "$prompt" 6 0 \
	"${kvw/\"first_token\":$ft/\"first_token\":$((ft ^ 1))}")" "$T/dw"
# one xfer_id in two decode requests at once: the second is refused
x=$(xid)
to "$PORT_D" "$(body "$prompt" 6 0 "$(kv "$x" "$PEER_P" prefill ', "on_failure": "recompute"')")" "$T/dup1" &
dpid=$!
settle 5 "$PORT_D/$(e num_requests_running)=1" || fail "D does not run the first request of the id"
to "$PORT_D" "$(body "$prompt" 6 0 "$(kv "$x" "$PEER_P" prefill)")" "$T/dup2"
wait $dpid
# bad parameters are refused
to "$PORT_D" "$(body "$prompt" 6 0 "$(kv 12 tcp://x:1 prefill)")" "$T/bad1"
to "$PORT_C" "$(body "$prompt" 6 0 "$(kv "$(xid)" "$PEER_P" prefill)")" "$T/bad2"

"$PY" - "$T" "$n" <<'PY' || fail "checks above"
import json, sys
T, n = sys.argv[1], int(sys.argv[2])
def rd(f): return open(f"{T}/{f}").read()
def code(f): return rd(f + ".code").strip()
def text(f):
    raw = rd(f)
    assert code(f) == "200", (f, code(f), raw)
    if not raw.startswith("data:"):
        return json.loads(raw)["choices"][0]["text"]
    out = ""
    for ev in raw.split("\n\n"):
        if not ev.startswith("data: ") or ev == "data: [DONE]": continue
        o = json.loads(ev[6:])
        assert "error" not in o, (f, o)
        out += o["choices"][0]["text"]
    return out
for i in range(1, n + 1):
    want = text(f"c{i}")
    x, peer = rd(f"x{i}").split()
    k = json.loads(rd(f"p{i}"))["kv_transfer_params"]
    assert k["xfer_id"] == x and k["remote_agent"] == peer, k
    assert k["do_remote_prefill"] is True and isinstance(k["first_token"], int), k
    assert text(f"p{i}") == want.split()[0], (i, rd(f"p{i}"), want)
    assert text(f"d{i}") == want, (i, "concurrent", text(f"d{i}"), want)
    assert text(f"ds{i}") == want, (i, "sequential", text(f"ds{i}"), want)
assert text("dr") == text("cf"), ("recompute", text("dr"), text("cf"))
assert code("df") == "502" and "KV transfer" in rd("df") and "kv_transfer_failed" in rd("df"), ("fail", rd("df"))
assert code("bad1") == "400" and code("bad2") == "400", (rd("bad1"), rd("bad2"))
assert text("dw") == text("cw"), ("a first_token not P's", text("dw"), text("cw"))
assert code("dup2") == "409" and "invalid_request_error" in rd("dup2") and \
    "in flight" in rd("dup2"), ("an xfer_id twice", code("dup2"), rd("dup2"))
assert text("dup1") == text("cw"), ("the first of the id", rd("dup1"))
PY

# every block free again on both sides (P frees once its agent has sent)
for port in "$PORT_P" "$PORT_D" "$PORT_C"; do
	ok=
	for _ in $(seq 50); do
		if curl -sS "http://127.0.0.1:$port/metrics" | "$PY" -c 'import sys
v = {}
for l in sys.stdin:
    if l.startswith("pdx_engine_kv_blocks_"):
        name, val = l.split()
        v[name.split("{")[0]] = float(val)
assert v["pdx_engine_kv_blocks_free"] == v["pdx_engine_kv_blocks_capacity"], v' 2>/dev/null; then
			ok=1
			break
		fi
		sleep 0.1
	done
	[ -n "$ok" ] || fail "engine on $port holds KV blocks: $(curl -sS "http://127.0.0.1:$port/metrics" | grep kv_blocks)"
done

named_stop P
named_stop D
named_stop C
named_stop agent_p
named_stop agent_d
echo "ok: P/D concurrent and sequential = colocated, recompute, fail, blocks free"
