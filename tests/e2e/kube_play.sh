#!/usr/bin/env bash
# deploy/k8s under podman: the 1p1d + podman overlay, rendered by
# `kubectl kustomize`, played by `podman kube play` (docs/kubernetes.md,
# "Under podman"): the proxy, both engines and both agents run in
# containers of pdx's image, the agents over CURVE with keys made here.
# pdx-bench through the proxy gets the same texts as a colocated engine
# of this build; each agent killed (SIGKILL: a crash, which the pod's
# restartPolicy restarts; `podman kill` counts as a stop by the user,
# which it does not) comes back on its own, its engine registers again
# (/health 200) and the instance is back in rotation (the same pdx-bench
# run gets the same texts again). Everything played is taken down at the
# end, whatever happens.
#   kube_play.sh BUILD_DIR
# The image: $PDX_KUBE_IMAGE if set, else scripts/image builds one (as
# localhost/pdx:kube-play, removed at the end). Skips (77) where podman,
# kubectl or scripts/image is missing, the image cannot be built, or
# podman cannot run a container here.
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
BUILD=$(cd "$1" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
ENGINE=$BUILD/engine/pdx-engine

skip() {
	echo "kube_play: $*: skipped"
	exit 77
}
command -v kubectl >/dev/null || skip "no kubectl"

# What this machine's podman needs (docs/kubernetes.md): runc, and
# ulimits it can set; the same for the pod's containers and for the
# cleanup processes that restart them.
cat >"$E2E_TMP/containers.conf" <<'EOF'
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]
[engine]
runtime = "runc"
EOF
export CONTAINERS_CONF=$E2E_TMP/containers.conf

PLAYED= BUILT= CURVE= SHM_A= SHM_B=
CONTAINERS="pdx-proxy-pod-0-pdx-proxy pdx-prefill-pod-0-pdx-engine
pdx-prefill-pod-0-pdx-agent pdx-decode-pod-0-pdx-engine pdx-decode-pod-0-pdx-agent"
kube_down() {
	trap '' TERM INT # the cleanup is not cut short
	if [ -n "$PLAYED" ]; then
		[ -n "${E2E_KEEP:-}" ] && for c in $CONTAINERS; do
			podman logs "$c" >"$E2E_TMP/$c.log" 2>&1
		done
		timeout 60 podman kube down "$PLAYED" >/dev/null 2>&1
		for p in pdx-proxy-pod-0 pdx-prefill-pod-0 pdx-decode-pod-0; do
			podman pod exists "$p" && timeout 60 podman pod rm -f "$p" >/dev/null 2>&1
		done
	fi
	[ -n "$SHM_B" ] && podman rm -f -t 0 "$SHM_B" >/dev/null 2>&1
	[ -n "$SHM_A" ] && podman rm -f -t 0 "$SHM_A" >/dev/null 2>&1
	[ -n "$BUILT" ] && podman rmi "$BUILT" >/dev/null 2>&1
	[ -n "$CURVE" ] && rm -rf "$CURVE"
	cleanup
}
trap kube_down EXIT
# a timeout's SIGTERM (meson's) takes the pods down too
trap 'exit 143' TERM
trap 'exit 130' INT

# fail, with the containers' last words
kfail() {
	local c
	for c in $CONTAINERS; do
		echo "--- $c" >&2
		podman logs --tail 8 "$c" 2>&1 | sed 's/^/  /' >&2
	done
	fail "$@"
}

# Every overlay renders; the shapes are as docs/kubernetes.md says: the
# agents native sidecars, readiness on /health and liveness on /live,
# xpyd 2 + 2, a PodMonitor for the monitoring overlay.
# render OVERLAY: its YAML in $E2E_TMP/OVERLAY.yaml
render() {
	kubectl kustomize "$ROOT/deploy/k8s/overlays/$1" >"$E2E_TMP/$1.yaml" \
		2>"$E2E_TMP/kustomize.log" ||
		fail "kubectl kustomize overlays/$1: $(tail -5 "$E2E_TMP/kustomize.log")"
}
# count OVERLAY N LINE: LINE (a whole line, spaces trimmed) N times
count() {
	local n
	n=$(sed 's/^ *//; s/ *$//' "$E2E_TMP/$1.yaml" | grep -cxF -- "$3")
	[ "$n" = "$2" ] || fail "overlay $1: '$3' $n times, want $2"
}
for o in 1p1d xpyd monitoring podman; do
	render $o
done
for o in 1p1d xpyd monitoring; do
	count $o 2 "restartPolicy: Always"
	count $o 3 "path: /health"
	count $o 4 "path: /live"
	count $o 1 "- --prefill-dns=pdx-prefill:8100"
	count $o 1 "- --decode-dns=pdx-decode:8100"
done
count 1p1d 3 "replicas: 1"
count xpyd 2 "replicas: 2"
count monitoring 2 "kind: PodMonitor"
count podman 0 "restartPolicy: Always"
# what a cluster's API server, controllers and Pod Security admission
# would refuse or ignore in the overlays for a cluster (k8s_check.py)
if $PY -c 'import yaml' 2>/dev/null; then
	for o in 1p1d xpyd monitoring; do
		$PY "$HERE/k8s_check.py" "$E2E_TMP/$o.yaml" 2>"$E2E_TMP/check.log" ||
			fail "overlay $o, as a cluster would take it:
$(cat "$E2E_TMP/check.log")"
	done
else
	echo "no python3 yaml (Debian: python3-yaml): the overlays not checked as a cluster would"
fi
cp "$E2E_TMP/podman.yaml" "$E2E_TMP/rendered.yaml"

command -v podman >/dev/null || skip "no podman"

IMAGE=${PDX_KUBE_IMAGE:-}
if [ -z "$IMAGE" ]; then
	[ -x "$ROOT/scripts/image" ] || skip "no scripts/image to build the image"
	IMAGE=$("$ROOT/scripts/image" --tag localhost/pdx:kube-play \
		2>"$E2E_TMP/image.log") ||
		skip "the image cannot be built here: $(tail -3 "$E2E_TMP/image.log")"
	BUILT=$IMAGE
fi
out=$(timeout 60 podman run --rm "$IMAGE" pdx-agent --help 2>&1) ||
	skip "podman cannot run a container of $IMAGE here: $(echo "$out" | tail -3)"

# A pod without the manifests' /dev/shm emptyDir has the runtime's
# 64 MiB: llama3-8b's 2 GiB pool does not fit, and the engine says so and
# exits 1 (it died of SIGBUS, saying nothing, while writing the pool).
out=$(timeout 60 podman run --rm "$IMAGE" pdx-engine --model llama3-8b --port 0 2>&1)
rc=$?
[ $rc = 1 ] && echo "$out" | grep -q "does not fit in /dev/shm (6[0-9] MiB free of 6[0-9] MiB)" ||
	fail "llama3-8b's pool in a 64 MiB /dev/shm: exit $rc, want 1 saying so: $(echo "$out" | tail -3)"
# Two engines in one pod's /dev/shm (its containers share the IPC
# namespace), each the PID 1 of its container: each pool has a name of
# its own, and the first's stays its own (the second replaced it: both
# were named /pdx-engine-1).
SHM_A=pdx-kube-shm-a-$$ SHM_B=pdx-kube-shm-b-$$
timeout 60 podman run -d --name "$SHM_A" --network none "$IMAGE" \
	pdx-engine --model tiny --port 0 >/dev/null || fail "podman run $SHM_A"
shm_ls() { podman exec "$SHM_A" ls -i /dev/shm; }
pool_of() { podman logs "$1" 2>&1 | sed -n 's/.*kv blocks ([0-9.]* MiB) in \/dev\/shm\/\(pdx-engine-[0-9a-f-]*\),.*/\1/p'; }
for _ in $(seq 100); do [ -n "$(pool_of "$SHM_A")" ] && break; sleep 0.1; done
pa=$(pool_of "$SHM_A")
a=$(shm_ls | awk -v n="$pa" '$2 == n { print $1 }')
[ -n "$pa" ] && [ -n "$a" ] || fail "no pool of $SHM_A in /dev/shm: '$pa': $(shm_ls)"
timeout 60 podman run -d --name "$SHM_B" --network none --ipc "container:$SHM_A" "$IMAGE" \
	pdx-engine --model tiny --port 0 >/dev/null || fail "podman run $SHM_B"
for _ in $(seq 100); do [ -n "$(pool_of "$SHM_B")" ] && break; sleep 0.1; done
pb=$(pool_of "$SHM_B")
[ -n "$pb" ] && [ "$pb" != "$pa" ] ||
	fail "the second engine in one /dev/shm: '$pb' beside '$pa': $(podman logs "$SHM_B" 2>&1 | tail -2)"
[ "$(shm_ls | awk -v n="$pa" '$2 == n { print $1 }')" = "$a" ] ||
	fail "the second engine replaced the first's pool: $(shm_ls)"
podman rm -f -t 0 "$SHM_B" "$SHM_A" >/dev/null 2>&1

# Free ports for the overlay's fixed ones (all one mapping, so a port
# picked here that equals another of the overlay's stays put), this
# test's key directory for the overlay's, the image, and the
# StatefulSets as Deployments: podman 4.3 plays Pods and Deployments only.
CURVE=$(mktemp -d /tmp/pdx-kube-curve.XXXXXX)
# eight distinct ports nobody listens on now
ports=$($PY "$HERE/../../scripts/free-ports" 8) || fail "no free ports"
declare -A PORT_OF
set -- $ports
for p in 18000 18001 18100 18101 18102 18200 18201 18202; do
	PORT_OF[$p]=$1
	shift
done
ports=""
for p in "${!PORT_OF[@]}"; do ports="$ports $p=${PORT_OF[$p]}"; done
$PY - "$E2E_TMP/rendered.yaml" "$E2E_TMP/play.yaml" "$CURVE" "$IMAGE" $ports <<'EOF' ||
import re, sys
src, dst, curve, image = sys.argv[1:5]
ports = dict(a.split("=") for a in sys.argv[5:])
s = open(src).read()
assert s.count("/tmp/pdx-kube-curve") == 2 and s.count("localhost/pdx:latest") == 5, s
s = re.sub(r"\b(%s)\b" % "|".join(ports), lambda m: ports[m.group(1)], s)
s = s.replace("/tmp/pdx-kube-curve", curve).replace("localhost/pdx:latest", image)
s = s.replace("kind: StatefulSet", "kind: Deployment")
open(dst, "w").write(s)
EOF
	fail "rendering the podman overlay for this test"
PX=${PORT_OF[18000]} PP=${PORT_OF[18100]} PD=${PORT_OF[18200]}

# The agents' keys and the peers file, as docs/kubernetes.md says, here
# with the addresses they advertise on this host; readable by the pods'
# user (10001) only, where root can give them to it.
chmod 755 "$CURVE"
for side in prefill decode; do
	"$BUILD/agent/pdx-agent" --curve-keygen "$CURVE/pdx-$side-0.key" >"$CURVE/$side.pub" ||
		fail "pdx-agent --curve-keygen"
done
printf 'tcp://127.0.0.1:%s %s\ntcp://127.0.0.1:%s %s\n' \
	"${PORT_OF[18101]}" "$(cat "$CURVE/prefill.pub")" \
	"${PORT_OF[18201]}" "$(cat "$CURVE/decode.pub")" >"$CURVE/peers"
if [ "$(id -u)" -eq 0 ]; then
	chown 10001:10001 "$CURVE"/*
else
	chmod 644 "$CURVE"/*
fi

PLAYED=$E2E_TMP/play.yaml
# pods of the same names left by a run that was killed
timeout 60 podman kube down "$PLAYED" >/dev/null 2>&1
timeout 120 podman kube play "$PLAYED" >"$E2E_TMP/play.log" 2>&1 ||
	kfail "podman kube play: $(tail -5 "$E2E_TMP/play.log")"

# until URL answers 200, at most S seconds
wait_200() {
	local url=$1 s=$2 i
	for i in $(seq $((s * 10))); do
		[ "$(curl -s -o /dev/null -w '%{http_code}' -m 2 "$url")" = 200 ] && return 0
		sleep 0.1
	done
	return 1
}
for c in $CONTAINERS; do
	[ "$(podman inspect --format '{{.State.Status}}' "$c" 2>/dev/null)" = running ] ||
		kfail "container $c is not running"
done
wait_200 "http://127.0.0.1:$PP/health" 60 || kfail "the prefill engine is not ready"
wait_200 "http://127.0.0.1:$PD/health" 60 || kfail "the decode engine is not ready"
wait_200 "http://127.0.0.1:$PX/ready" 30 || kfail "the proxy is not ready"

named_engine_start C "$ENGINE" --model tiny
# bench LABEL PORT: 20 prompts, 4 at a time, texts in LABEL.json
bench() {
	"$BUILD/bench/pdx-bench" --host 127.0.0.1 --port "$2" --model tiny \
		--dataset-name random --random-input-len 64 --random-output-len 16 \
		--num-prompts 20 --seed 1 --max-concurrency 4 --disable-tqdm \
		--save-detailed --result-dir "$E2E_TMP" --result-filename "$1.json" \
		>"$E2E_TMP/$1.out" 2>&1 || kfail "pdx-bench $1: $(tail -5 "$E2E_TMP/$1.out")"
}
same_texts() {
	$PY - "$E2E_TMP/$1.json" "$E2E_TMP/colocated.json" <<'EOF' || kfail "$1: not the colocated engine's texts"
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:])
assert a["completed"] == b["completed"] == 20, (a["completed"], b["completed"])
assert a["generated_texts"] == b["generated_texts"], (a["generated_texts"], b["generated_texts"])
EOF
}
bench colocated "$PORT_C"
bench podman "$PX"
same_texts podman
# the KV went between the agents, over CURVE
for side in prefill decode; do
	podman logs "pdx-$side-pod-0-pdx-agent" 2>&1 | grep -q "peer link secured with CURVE" ||
		kfail "the $side agent is not on CURVE"
	podman logs "pdx-$side-pod-0-pdx-agent" 2>&1 | grep -q "peer tcp://127.0.0.1:[0-9]* ready" ||
		kfail "the $side agent met no peer"
done

# An agent killed: restarted by podman, its engine registers again and
# is ready, the instance serves through the proxy again.
for side in decode prefill; do
	c=pdx-$side-pod-0-pdx-agent
	port=$PP
	[ $side = decode ] && port=$PD
	pid=$(podman inspect --format '{{.State.Pid}}' "$c") && [ "$pid" -gt 0 ] ||
		kfail "no pid for $c"
	kill -KILL "$pid"
	for _ in $(seq 300); do
		[ "$(podman inspect --format '{{.RestartCount}}' "$c")" -ge 1 ] &&
			podman logs "pdx-$side-pod-0-pdx-engine" 2>&1 | grep -q "registered again with the agent" &&
			break
		sleep 0.1
	done
	[ "$(podman inspect --format '{{.RestartCount}} {{.State.Status}}' "$c")" = "1 running" ] ||
		kfail "$c was not restarted once: $(podman inspect --format '{{.RestartCount}} {{.State.Status}}' "$c")"
	podman logs "pdx-$side-pod-0-pdx-engine" 2>&1 | grep -q "registered again with the agent" ||
		kfail "the $side engine did not register with its new agent"
	wait_200 "http://127.0.0.1:$port/health" 30 || kfail "the $side engine is not ready again"
	# back in the proxy's rotation: its health checks see it again
	for _ in $(seq 100); do
		code=$(curl -s -o "$E2E_TMP/body" -w '%{http_code}' -m 10 -H 'Content-Type: application/json' \
			-d '{"prompt": "back again", "max_tokens": 3}' "http://127.0.0.1:$PX/v1/completions")
		[ "$code" = 200 ] && break
		sleep 0.1
	done
	[ "$code" = 200 ] || kfail "no request served after the $side agent came back: $code $(cat "$E2E_TMP/body")"
	bench "after-$side" "$PX"
	same_texts "after-$side"
done
named_stop C
echo ok
