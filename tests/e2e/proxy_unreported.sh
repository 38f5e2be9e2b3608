#!/usr/bin/env bash
# Transfers no agent reports (agents started without --notify, behind a
# proxy with --notify-bind): each one that expires after
# --transfer-timeout is said at warn, at most once a second with how
# many more since, naming the instances and the likely cause (the
# agents' --notify does not reach the proxy, or the transfer hung). They
# went by unsaid, and the proxy's least-loaded counted them for a
# minute.
#   proxy_unreported.sh PDX_ENGINE PDX_AGENT PDX_PROXY
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
# shellcheck disable=SC2034 # pd_engine_start (lib.sh) reads them
ENGINE=$1
# shellcheck disable=SC2034
AGENT=$2
PROXY=$3

pd_engine_start P prefill --time-scale 0
pd_engine_start D decode --time-scale 0
notify="tcp://127.0.0.1:$(free_port)"
named_engine_start X "$PROXY" --prefill "127.0.0.1:$PORT_P" \
	--decode "127.0.0.1:$PORT_D" --notify-bind "$notify" \
	--transfer-timeout 1
wait_healthy X

# three at once (one warning, two held back), then one more: the last
# comes more than a second after the first warning, which says it with
# the two held back
for _ in 1 2 3; do
	[ -n "$(text "$PORT_X" "nobody reports this" 3)" ] || fail "no text"
done
settle 10 "$PORT_X/pdx_proxy_transfers_expired_total=3" ||
	fail "the three transfers did not expire"
[ -n "$(text "$PORT_X" "nor this" 3)" ] || fail "no text"
settle 10 "$PORT_X/pdx_proxy_transfers_expired_total=4" ||
	fail "the fourth transfer did not expire"
said=$(grep "not reported in 1 s" "$E2E_TMP/X.log")
[ -n "$said" ] || fail "no warning of transfers nobody reported: $(tail -5 "$E2E_TMP/X.log")"
echo "$said" | head -1
while read -r line; do
	for want in " W " "prefill http://127.0.0.1:$PORT_P" \
		"decode http://127.0.0.1:$PORT_D" \
		"--notify does not reach this proxy (--notify-bind $notify)" \
		"or the transfer hung"; do
		echo "$line" | grep -q -- "$want" || fail "'$want' not in: $line"
	done
done <<<"$said"
# every expiry said or counted in a later line: 4
lines=$(echo "$said" | wc -l)
held=$(echo "$said" | sed -n 's/.*(and \([0-9]*\) more since the last said).*/\1/p' |
	awk '{ n += $1 } END { print n + 0 }')
[ $((lines + held)) = 4 ] ||
	fail "4 expired, $lines line(s) said with $held more: $said"
[ "$lines" -lt 4 ] || fail "one line each: not once a second: $said"
echo "ok: 4 transfers nobody reported: $lines warning(s), $held held back and counted"

for n in X P D agent_p agent_d; do named_stop $n; done
