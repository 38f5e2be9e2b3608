#!/usr/bin/env bash
# Every installed program's --version: "NAME VERSION" on stdout, exit 0,
# VERSION what `git describe --always --dirty` says of the source tree
# (the meson project version outside git); --help lists --version.
#   version.sh SOURCE_ROOT PROJECT_VERSION PROGRAM...
set -u
src=$1
want=$(git -C "$src" describe --always --dirty 2>/dev/null) || want=$2
shift 2
[ -n "$want" ] || { echo "FAIL: no version to expect" >&2; exit 1; }
for bin in "$@"; do
	name=$(basename "$bin")
	out=$("$bin" --version) || { echo "FAIL: $name --version exited $?" >&2; exit 1; }
	[ "$out" = "$name $want" ] ||
		{ echo "FAIL: $name --version said '$out', not '$name $want'" >&2; exit 1; }
	"$bin" --help | grep -q -- '--version' ||
		{ echo "FAIL: $name --help does not list --version" >&2; exit 1; }
	echo "$out"
done
