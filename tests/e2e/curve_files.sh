#!/usr/bin/env bash
# pdx-agent's CURVE files, as docs/security.md has them written: each
# mistake stops the agent at start (exit 1) saying what is wrong with
# which line. A peers line without a key (it was read from uninitialised
# memory), a key a shell here-document cut short at its '$' (Z85 has
# '$'; the reason names the quoting), an address without tcp://, and a
# directory given as the key or the peers file (it said the key file
# had no key lines, and warned about the directory's mode).
#   curve_files.sh PDX_AGENT
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
AGENT=$1
D=$E2E_TMP
sock="ipc://$D/a.engine"

key=$("$AGENT" --curve-keygen "$D/a.key") || fail "--curve-keygen"
[ ${#key} = 40 ] || fail "--curve-keygen printed '$key'"

# refused: the agent's exit status and its reason, for a peers file
# and a key file
refused() { # WANT PEERS [KEYFILE]
	timeout 10 "$AGENT" --engine "$sock" \
		--listen "tcp://127.0.0.1:$(free_port)" \
		--curve-key "${3:-$D/a.key}" --curve-peers "$2" 2>"$D/err.log"
	rc=$?
	[ $rc = 1 ] || fail "$2: exit $rc, want 1: $(cat "$D/err.log")"
	grep -qF -- "$1" "$D/err.log" ||
		fail "$2: want '$1' in: $(cat "$D/err.log")"
}

printf 'tcp://127.0.0.1:7001\n' >"$D/nokey"
refused "nokey line 1: want \"tcp://HOST:PORT PUBLIC-KEY\": no public key after the address" "$D/nokey"
printf '# members\n\n127.0.0.1:7001 %s\n' "$key" >"$D/noscheme"
refused "noscheme line 3: want \"tcp://HOST:PORT PUBLIC-KEY\": the address does not start with tcp://" "$D/noscheme"
# a key with a '$' pasted into an unquoted here-document: the shell
# expanded "$..." to nothing
printf 'tcp://127.0.0.1:7001 %s\n' "${key:0:17}${key:25}" >"$D/cut"
refused "cut line 1: want \"tcp://HOST:PORT PUBLIC-KEY\": the key is not 40 characters of Z85 (written by a shell here-document? quote its word: <<'EOF')" "$D/cut"
mkdir "$D/dir"
refused "CURVE peers $D/dir: not a regular file" "$D/dir"
printf 'tcp://127.0.0.1:7001 %s\n' "$key" >"$D/peers"
refused "CURVE key $D/dir: not a regular file" "$D/peers" "$D/dir"
! grep -q "readable by others" "$D/err.log" ||
	fail "a directory as the key: $(cat "$D/err.log")"

# and the files as written start the agent
port=$(free_port)
printf 'tcp://127.0.0.1:%s %s\n' "$port" "$key" >"$D/peers"
"$AGENT" --engine "$sock" --listen "tcp://127.0.0.1:$port" \
	--curve-key "$D/a.key" --curve-peers "$D/peers" 2>"$D/ok.log" &
pid=$!
E2E_PIDS="$E2E_PIDS $pid"
for _ in $(seq 50); do
	grep -q "ready:" "$D/ok.log" && break
	sleep 0.1
done
grep -q "peer link secured with CURVE" "$D/ok.log" ||
	fail "good files: $(cat "$D/ok.log")"
kill "$pid"
wait "$pid" || fail "agent exit $?: $(cat "$D/ok.log")"
echo ok
