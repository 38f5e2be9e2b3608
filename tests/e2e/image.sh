#!/usr/bin/env bash
# scripts/image from a fresh clone of this commit: the image builds, and in
# a container, as its non-root user, every program's --version says the
# clone's `git describe`, the Python package imports and loads libpdx, and
# a prefill and a decode engine with their agents behind pdx-proxy answer
# as a colocated engine does (image_smoke.py). The image is tagged for this test alone
# and the tag removed at the end (the image too, unless another tag, e.g.
# localhost/pdx:latest of the same commit, names it).
# Given a build directory, kube_play.sh then plays deploy/k8s with that
# image (PDX_KUBE_IMAGE): one image built for both, where each built its
# own (two minutes of CI); kube_play's own skip is said, not a failure.
# Skips (77), saying why, where it cannot run: not root, not a git
# checkout, mmdebstrap or podman missing, the Debian archive unreachable,
# podman unable to run a container.
#   image.sh SOURCE_ROOT [BUILD_DIR]
set -u
SRC=$1
BUILD=${2:-}
HERE=$(cd "$(dirname "$0")" && pwd)
skip() {
	echo "SKIP: $*" >&2
	exit 77
}
fail() {
	echo "FAIL: $*" >&2
	exit 1
}
[ "$(id -u)" -eq 0 ] || skip "scripts/image needs root"
for t in mmdebstrap podman runc; do
	command -v $t >/dev/null || skip "$t is not installed (scripts/deps installs it)"
done
podman info >/dev/null 2>&1 || skip "podman info fails: $(podman info 2>&1 | tail -1)"
git -C "$SRC" rev-parse HEAD >/dev/null 2>&1 || skip "$SRC is not a git checkout to clone"

TMP=$(mktemp -d)
TAG=localhost/pdx-e2e-image:$$
cleanup() {
	podman rmi "$TAG" >/dev/null 2>&1
	rm -rf "$TMP"
}
trap cleanup EXIT

git clone -q "$SRC" "$TMP/pdx" || fail "git clone $SRC"
git -C "$TMP/pdx" checkout -q "$(git -C "$SRC" rev-parse HEAD)" ||
	fail "checking out HEAD in the clone"
want=$(git -C "$TMP/pdx" describe --always --dirty)
name=$("$TMP/pdx/scripts/image" --tag "$TAG" 2>"$TMP/image.log") || {
	grep -Eq "Failed to fetch|Could not resolve|Temporary failure resolving" "$TMP/image.log" &&
		skip "mmdebstrap cannot reach the Debian archive: $(grep -Em1 'Failed to fetch|resolv' "$TMP/image.log")"
	fail "scripts/image: $(tail -20 "$TMP/image.log")"
}
[ "$name" = "$TAG" ] || fail "scripts/image printed '$name', not '$TAG'"
tail -1 "$TMP/image.log"

# This machine: runc (crun refuses its cgroup setup) and ulimits podman's
# defaults exceed; no network needed.
run() {
	podman --runtime runc run --rm -i --network none \
		--ulimit nofile=1024:1024 --ulimit nproc=1024:1024 "$TAG" "$@"
}
run true 2>"$TMP/run.log" ||
	skip "podman cannot run a container here: $(tail -3 "$TMP/run.log")"

out=$(run sh -c 'id -u; for p in pdx-agent pdx-engine pdx-proxy pdx-bench pdx-xferbench; do
	$p --version || echo "$p failed"; done
	python3 -c "import pdx, pdx.vllm, pdx.sglang; print(pdx.library_path, pdx.status_str(0))"' 2>&1)
printf '%s\n' "$out"
expect=$(printf '%s\n' 10001 "pdx-agent $want" "pdx-engine $want" "pdx-proxy $want" \
	"pdx-bench $want" "pdx-xferbench $want" \
	"/usr/lib/$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null)/libpdx.so.0 ok")
[ "$out" = "$expect" ] || fail "in the container: expected
$expect"
run python3 - <"$HERE/image_smoke.py" || fail "the P/D smoke run in the container"

if [ -n "$BUILD" ]; then
	PDX_KUBE_IMAGE=$TAG bash "$HERE/kube_play.sh" "$BUILD"
	rc=$?
	[ $rc = 77 ] && echo "kube_play skipped (above): the image itself passed"
	[ $rc = 0 ] || [ $rc = 77 ] || fail "kube_play.sh with this image: exit $rc"
fi
