#!/usr/bin/env bash
# scripts/demo at small scale (tiny model) with the binaries under test, in
# each flow, once with deepseek-v3 (MLA) and once with TP 2 -> 2 (2 -> 4
# and TP with --kv-device cuda refused, saying why): it exits 0, its
# --json file holds both results with every request completed, and it
# leaves no process behind. Then SIGTERM in the
# middle of a run (Ctrl-C's SIGINT takes the same path, but a background
# job of a script ignores SIGINT): exit 143, nothing left running; and
# SIGKILL, after which its watchdog stops what it started.
#   demo.sh BUILD_DIR
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
BUILD=$(cd "$1" && pwd)
DEMO="$HERE/../../scripts/demo"

# (this build's only: a demo of another build dir on the host, a suite
# of another checkout run beside this one, is not this test's)
left() { pgrep -f "^$BUILD/.*ipc:///tmp/pdx-demo\." || true; }

# demo_fail FLOW WHY: the demo's own logs' last lines, then fail
demo_fail() {
	local f
	for f in "$E2E_TMP/$1"/*.log "$E2E_TMP/$1"/*.txt; do
		[ -f "$f" ] && { echo "== $f" >&2; tail -15 "$f" >&2; }
	done
	fail "$2"
}

[ -z "$(left)" ] || fail "demo processes running before the test: $(left)"
# bad values are refused before anything starts (exit 2); pdx-bench
# refused some only after every process had started and warmed up, and
# the engines the model, time scale and pool size (exit 1)
for bad in "--request-rate abc" "--request-rate 0" "--num-prompts 0" \
	"--max-concurrency 0" "--max-concurrency ''" "--build $E2E_TMP/none" \
	"--model nope" "--time-scale abc" "--kv-blocks 0"; do
	eval "set -- $bad" # the option and its value, maybe empty
	"$DEMO" --build "$BUILD" "$@" --out "$E2E_TMP/bad" 2>"$E2E_TMP/bad.err" >/dev/null
	rc=$?
	[ $rc = 2 ] || fail "demo $bad: exit $rc, want 2: $(tail -2 "$E2E_TMP/bad.err")"
	[ ! -e "$E2E_TMP/bad" ] || fail "demo $bad: started a run"
done
# one --out for the three, one run right after the other (as a loop over
# the flows with the default --out would): an --out whose run ended is
# free at once
for flow in concurrent sequential early-callback; do
	"$DEMO" --build "$BUILD" --model tiny --input-len 48 --output-len 6 \
		--num-prompts 12 --max-concurrency 3 --flow "$flow" --quiet \
		--out "$E2E_TMP/flows" --json "$E2E_TMP/$flow.json" \
		>"$E2E_TMP/$flow.txt" 2>"$E2E_TMP/$flow.err" ||
		demo_fail flows "demo --flow $flow: $(tail -5 "$E2E_TMP/$flow.err")"
	grep -q "pdx demo: disaggregated ($flow flow) vs colocated" "$E2E_TMP/$flow.txt" ||
		fail "demo --flow $flow printed no report"
	"$PY" -c "import json; r = json.load(open('$E2E_TMP/$flow.json'))
for k in ('disaggregated', 'colocated'):
    assert r[k]['completed'] == 12 and r[k]['failed'] == 0, (k, r[k]['completed'], r[k]['failed'])
    assert r[k]['mean_ttft_ms'] > 0 and r[k]['total_output_tokens'] == 72, r[k]" ||
		demo_fail flows "demo --flow $flow: results"
	[ -z "$(left)" ] || fail "demo --flow $flow left processes: $(left)"
done

# MLA: deepseek-v3's latent KV, a few 64-token blocks a prompt; run
# from another directory, whose relative --out and --json it takes
(cd "$E2E_TMP" && "$DEMO" --build "$BUILD" --model deepseek-v3 --input-len 150 --output-len 4 \
	--num-prompts 6 --max-concurrency 2 --time-scale 0 --kv-blocks 24 \
	--quiet --out mla --json mla.json) \
	>"$E2E_TMP/mla.txt" 2>"$E2E_TMP/mla.err" ||
	demo_fail mla "demo --model deepseek-v3: $(tail -5 "$E2E_TMP/mla.err")"
"$PY" -c "import json; r = json.load(open('$E2E_TMP/mla.json'))
for k in ('disaggregated', 'colocated'):
    assert r[k]['completed'] == 6 and r[k]['failed'] == 0, (k, r[k]['completed'], r[k]['failed'])
    assert r[k]['total_output_tokens'] == 24, r[k]" ||
	demo_fail mla "demo --model deepseek-v3: results"
[ -z "$(left)" ] || fail "demo --model deepseek-v3 left processes: $(left)"

# tensor parallelism 2 -> 2: two engines and two agents a side
"$DEMO" --build "$BUILD" --model tiny --input-len 48 --output-len 6 \
	--num-prompts 12 --max-concurrency 3 --prefill-tp 2 --decode-tp 2 \
	--quiet --out "$E2E_TMP/tp" --json "$E2E_TMP/tp.json" \
	>"$E2E_TMP/tp.txt" 2>"$E2E_TMP/tp.err" ||
	demo_fail tp "demo --prefill-tp 2 --decode-tp 2: $(tail -5 "$E2E_TMP/tp.err")"
"$PY" -c "import json; r = json.load(open('$E2E_TMP/tp.json'))
for k in ('disaggregated', 'colocated'):
    assert r[k]['completed'] == 12 and r[k]['failed'] == 0, (k, r[k]['completed'], r[k]['failed'])
    assert r[k]['total_output_tokens'] == 72, r[k]" ||
	demo_fail tp "demo --prefill-tp 2 --decode-tp 2: results"
for s in p1 d1; do
	grep -q "tensor-parallel rank 1 of 2" "$E2E_TMP/tp/$s.log" ||
		demo_fail tp "demo --prefill-tp 2: no rank 1 in $s.log"
done
[ -z "$(left)" ] || fail "demo --prefill-tp 2 left processes: $(left)"
# 1 -> 2: the agents reshard the KV heads
"$DEMO" --build "$BUILD" --model tiny --input-len 48 --output-len 6 \
	--num-prompts 6 --max-concurrency 3 --prefill-tp 1 --decode-tp 2 \
	--quiet --out "$E2E_TMP/tp12" --json "$E2E_TMP/tp12.json" \
	>"$E2E_TMP/tp12.txt" 2>"$E2E_TMP/tp12.err" ||
	demo_fail tp12 "demo --prefill-tp 1 --decode-tp 2: $(tail -5 "$E2E_TMP/tp12.err")"
"$PY" -c "import json; r = json.load(open('$E2E_TMP/tp12.json'))
for k in ('disaggregated', 'colocated'):
    assert r[k]['completed'] == 6 and r[k]['failed'] == 0, (k, r[k]['completed'], r[k]['failed'])" ||
	demo_fail tp12 "demo --prefill-tp 1 --decode-tp 2: results"
[ -z "$(left)" ] || fail "demo 1 -> 2 left processes: $(left)"
"$DEMO" --build "$BUILD" --prefill-tp 2 --decode-tp 2 --kv-device cuda 2>"$E2E_TMP/tpcuda.err" &&
	fail "demo TP 2 with --kv-device cuda ran"
grep -q "host memory only" "$E2E_TMP/tpcuda.err" || fail "demo TP 2 on cuda: why: $(cat "$E2E_TMP/tpcuda.err")"

# benching TAG: a long demo in the background (its pid in $pid), once
# it runs pdx-bench
benching() {
	"$DEMO" --build "$BUILD" --model tiny --input-len 48 --output-len 400 \
		--num-prompts 400 --max-concurrency 2 --time-scale 200 \
		--out "$E2E_TMP/$1" >/dev/null 2>"$E2E_TMP/$1.err" &
	pid=$!
	for _ in $(seq 300); do
		grep -q "pdx-bench against" "$E2E_TMP/$1.err" && break
		sleep 0.1
	done
	grep -q "pdx-bench against" "$E2E_TMP/$1.err" || fail "$1: the demo never reached pdx-bench"
	sleep 0.5
}

# SIGTERM while pdx-bench runs: everything stops, exit 143
benching int
kill -TERM $pid
wait $pid
rc=$?
[ $rc -eq 143 ] || fail "terminated demo exited $rc, want 143"
sleep 0.5
[ -z "$(left)" ] || fail "interrupted demo left processes: $(left)"

# SIGKILL while pdx-bench runs (no trap): its watchdog stops everything
# it started (the proxy and pdx-bench included) within 10 s
benching kill
kids=$(pgrep -P $pid | tr '\n' ' ')
kill -KILL $pid
wait $pid 2>/dev/null
running() { # processes, not zombies
	left
	for p in $kids; do
		grep -qs '^[0-9]* (.*) [^Z]' "/proc/$p/stat" && echo "$p ($(tr '\0' ' ' </proc/"$p"/cmdline))"
	done
}
for _ in $(seq 100); do
	[ -z "$(running)" ] && break
	sleep 0.1
done
[ -z "$(running)" ] || fail "demo killed with -9 left processes after 10 s: $(running)"
echo ok
