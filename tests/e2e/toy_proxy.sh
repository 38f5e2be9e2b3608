#!/usr/bin/env bash
# vLLM's own example proxy (toy_proxy_server.py, unchanged, read from
# ../shared/peers/vllm/) in front of a real prefill engine and decode
# engine, each with its pdx-agent: it sends the prefill side only
# {"do_remote_decode": true, ...nulls}, so the prefill engine mints the
# transfer id and leaves its receiver open, and the decode agent claims
# it with the object the proxy copies back unchanged. The text equals
# pdx-proxy's (sequential flow, both sides named) on the same engines,
# for completions and chat, streamed and not; the agents count every
# transfer received and sent, none failed; no KV block is held after.
#   toy_proxy.sh PDX_ENGINE PDX_AGENT PDX_PROXY
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
ENGINE=$1
AGENT=$2
PROXY=$3
TOY=$HERE/../../../shared/peers/vllm/toy_proxy_server.py
[ -f "$TOY" ] || { echo "# skip: no $TOY"; exit 77; }
$PY -c 'import fastapi, httpx, uvicorn' 2>/dev/null ||
	{ echo "# skip: python3-fastapi, python3-uvicorn or python3-httpx missing"; exit 77; }

AGENT_OPTS+=(--metrics 127.0.0.1:0 --lease-ms 3000)
pd_engine_start P prefill --time-scale 0
pd_engine_start D decode --time-scale 0
named_engine_start XS "$PROXY" --prefill "127.0.0.1:$PORT_P" \
	--decode "127.0.0.1:$PORT_D" --flow sequential
PORT_T=$(free_port)
bg_start T env -u OPENAI_API_KEY $PY "$HERE/toy_proxy_run.py" "$TOY" --port "$PORT_T" \
	--prefiller-hosts 127.0.0.1 --prefiller-ports "$PORT_P" \
	--decoder-hosts 127.0.0.1 --decoder-ports "$PORT_D"
for _ in $(seq 300); do
	curl -sf "http://127.0.0.1:$PORT_T/healthcheck" >/dev/null 2>&1 && break
	kill -0 "$PID_T" 2>/dev/null || fail "toy proxy exited at start: $(tail -5 "$E2E_TMP/T.log")"
	sleep 0.1
done
curl -sf "http://127.0.0.1:$PORT_T/healthcheck" >/dev/null ||
	fail "toy proxy did not start: $(tail -5 "$E2E_TMP/T.log")"

# same ROUTE REQUEST KIND MAX_TOKENS: the toy proxy answers as pdx-proxy
# does, whole and streamed.
n_xfers=0
same() {
	local route=$1 req=$2 kind=$3 n=$4 tag=$((E2E_SEQ += 1))
	PORT=$PORT_XS post "$route" "$req}" >"$E2E_TMP/x_$tag.json"
	status_is 200 "pdx-proxy: $req"
	PORT=$PORT_T post "$route" "$req}" >"$E2E_TMP/t_$tag.json"
	status_is 200 "toy proxy: $req"
	py "import json; a=json.load(open('$E2E_TMP/x_$tag.json'))['choices'][0]; b=json.load(open('$E2E_TMP/t_$tag.json'))['choices'][0]; assert a.get('text', a.get('message')) == b.get('text', b.get('message')), (a, b)" \
		"toy proxy's text equals pdx-proxy's: $req"
	curl -sS -N -d "$req, \"stream\": true, \"stream_options\": {\"include_usage\": true}}" \
		"http://127.0.0.1:$PORT_T$route" >"$E2E_TMP/t_$tag.sse" ||
		fail "toy proxy: stream $req"
	"$PY" "$HERE/sse_check.py" "$E2E_TMP/x_$tag.json" "$E2E_TMP/t_$tag.sse" \
		"$kind" "$n" >/dev/null || fail "toy proxy's stream vs pdx-proxy: $req: $(head -c 300 "$E2E_TMP/t_$tag.sse")"
	n_xfers=$((n_xfers + 3))
}

n=0
for p in '"Hello, world!"' '"The quick brown fox jumps over the lazy dog again and again"' \
	'[1, 2, 3, 4, 5, 6, 7, 8, 9]' '"a"'; do
	n=$((n + 1))
	same /v1/completions "{\"model\": \"tiny\", \"prompt\": $p, \"max_tokens\": $((n * 4))" text $((n * 4))
done
same /v1/chat/completions \
	'{"model": "tiny", "messages": [{"role": "user", "content": "Tell me about KV caches"}], "max_tokens": 7' chat 7

# every request moved its KV between the agents (the decode engine does
# not prefill on its own: on_failure is "fail"), and nothing is held
mp=$(agent_metrics_port p) || exit 1
md=$(agent_metrics_port d) || exit 1
settle 10 "$mp/pdx_agent_transfers_total{outcome=\"sent\",path=\"ipc\"}=$n_xfers" \
	"$md/pdx_agent_transfers_total{outcome=\"received\",path=\"ipc\"}=$n_xfers" \
	"$mp/pdx_agent_transfers_total{outcome=\"failed\",path=\"ipc\"}=0" \
	"$md/pdx_agent_transfers_total{outcome=\"failed\",path=\"ipc\"}=0" \
	"$md/pdx_agent_transfers_live{role=\"recv\"}=0" \
	"$mp/pdx_agent_transfers_live{role=\"send\"}=0" ||
	fail "transfers as the agents count them"
blocks_free "$PORT_P" "$PORT_D"

# the prefill side's answer, as the toy proxy sends for it: a minted id,
# its own agent, what the decode side needs, vLLM's nulls ignored
PORT=$PORT_P post /v1/completions '{"prompt": "hi", "max_tokens": 1, "stream": false,
	"kv_transfer_params": {"do_remote_decode": true, "do_remote_prefill": false,
	"remote_engine_id": null, "remote_block_ids": null, "remote_host": null,
	"remote_port": null}}' >"$E2E_TMP/p.json"
status_is 200 "prefill with vLLM's kv_transfer_params"
py "import json, re; k=json.load(open('$E2E_TMP/p.json'))['kv_transfer_params']
assert re.fullmatch('[0-9a-f]{32}', k['xfer_id']), k
assert k['remote_agent'].startswith('tcp://127.0.0.1:'), k
assert k['do_remote_prefill'] is True and k['do_remote_decode'] is False, k
assert isinstance(k['first_token'], int), k" "the prefill side's answer"

# nobody claims that one: its lease ends it, and its blocks are free
settle 20 "$mp/pdx_agent_transfers_total{outcome=\"failed\",path=\"none\"}=1" ||
	fail "an unclaimed open send did not end"
blocks_free "$PORT_P"

named_stop T
named_stop XS
named_stop D
named_stop P
named_stop agent_d
named_stop agent_p
echo ok
