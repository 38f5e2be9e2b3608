#!/usr/bin/env bash
# One short fuzzing run of a target over its seed corpus (the meson suite
# "fuzz"): new inputs go to a scratch directory, never into the repository.
#   run.sh TARGET_BIN CORPUS_DIR [DICT] [SECONDS]
# Crash inputs land in the current directory (meson's build dir) as
# crash-*, leak-*, timeout-*; add them to the corpus once fixed.
set -u
bin=$1 corpus=$2 dict=${3:-} secs=${4:-8}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
# libFuzzer's own exit status for a crash or leak is 77, which meson
# reads as "skipped": a finding must fail the test
args=(-max_total_time="$secs" -timeout=10 -rss_limit_mb=2048
	-max_len=65536 -print_final_stats=1 -error_exitcode=1
	-timeout_exitcode=1)
[ -n "$dict" ] && args+=(-dict="$dict")
"$bin" "${args[@]}" "$scratch" "$corpus"
