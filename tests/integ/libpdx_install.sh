#!/usr/bin/env bash
# libpdx as an engine outside the tree meets it: `meson install` into a
# temporary root, then, from that install alone,
#   - the library's soname is libpdx.so.0 and it exports exactly the
#     functions its installed headers declare;
#   - the headers compile as C++ and their functions link from it;
#   - tests/outside/transfer.c, built by cc with pkg-config --cflags
#     --libs pdx, completes a byte-exact transfer between two of the
#     installed pdx-agents (which find the installed libpdx by their rpath).
# Args: BUILD-DIR SOURCE-DIR SANITIZE (meson's b_sanitize).
. "$(dirname "$0")/../e2e/lib.sh"

# meson test points LD_LIBRARY_PATH at the build tree's libpdx: nothing
# here may find it there
unset LD_LIBRARY_PATH
BUILD=$1
SRC=$2
SAN=${3:-none}
ROOT=$E2E_TMP/root
FLAGS=()
[ "$SAN" != none ] && FLAGS=("-fsanitize=$SAN")

meson install -C "$BUILD" --destdir "$ROOT" --no-rebuild --quiet \
	>"$E2E_TMP/install.log" 2>&1 || fail "meson install: $(tail -5 "$E2E_TMP/install.log")"
pc=$(find "$ROOT" -name pdx.pc)
[ -n "$pc" ] || fail "no pdx.pc installed"
prefix=$(sed -n 's/^prefix=//p' "$pc")
# the .pc names its prefix; the install sits under $ROOT
pkg() { PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --define-variable=prefix="$ROOT$prefix" "$@" pdx; }
cflags=$(pkg --cflags) && libs=$(pkg --libs) || fail "pkg-config pdx"
libdir=$(pkg --variable=libdir)
so=$libdir/libpdx.so.0
[ -f "$so" ] || fail "no $so"

readelf -d "$so" | grep -q 'SONAME.*\[libpdx\.so\.0\]' ||
	fail "soname: $(readelf -d "$so" | grep SONAME)"

# What the installed headers declare (comments gone: the preprocessor's
# output) against what the library exports.
for h in "$ROOT$prefix"/include/pdx/*.h; do echo "#include <pdx/$(basename "$h")>"; done |
	cc -E -P $cflags - | grep -o '\bpdx_[a-z0-9_]* *(' | tr -d ' (' | sort -u >"$E2E_TMP/declared"
nm -D --defined-only "$so" | awk '$2 != "A" { sub(/@.*/, "", $3); print $3 }' |
	sort -u >"$E2E_TMP/exported"
[ "$(wc -l <"$E2E_TMP/declared")" -ge 20 ] || fail "too few declarations read: $(cat "$E2E_TMP/declared")"
diff -u "$E2E_TMP/declared" "$E2E_TMP/exported" >"$E2E_TMP/abi.diff" ||
	fail "exports differ from the headers (- declared only, + exported only): $(cat "$E2E_TMP/abi.diff")"
echo "abi: $(wc -l <"$E2E_TMP/exported") functions exported, as declared; soname libpdx.so.0"

# C++: the headers compile, extern "C" links. The program also meets no
# agent and registers nothing: the send fails at once (ENOTREG), and the
# library says so on stderr, at
# the level PDX_LOG_LEVEL or pdx_engine_set_log_level() (which wins) sets.
cat >"$E2E_TMP/cxx.cc" <<'EOF'
#include <pdx/engine.h>
#include <pdx/layout.h>
#include <pdx/status.h>
#include <cstring>
int main(int argc, char **argv)
{
	struct pdx_engine_params p = {};
	struct pdx_engine *e;
	struct pdx_xfer_id x = {};
	uint32_t block = 0;

	p.agent = argv[1];
	if (pdx_engine_set_log_level("loud") != PDX_EINVAL ||
	    (argc > 2 && pdx_engine_set_log_level(argv[2]) != PDX_OK))
		return 2;
	if (pdx_engine_connect(&p, &e) != PDX_OK)
		return 3;
	if (pdx_engine_send(e, &x, "tcp://127.0.0.1:1", &block, 1) != PDX_ENOTREG)
		return 4;
	pdx_engine_free(e);
	return std::strcmp(pdx_status_str(PDX_EAGENT), "the engine's agent went away");
}
EOF
c++ -Wall -Wextra -Werror "${FLAGS[@]}" "$E2E_TMP/cxx.cc" -o "$E2E_TMP/cxx" $cflags $libs \
	2>"$E2E_TMP/cxx.log" || fail "C++: $(cat "$E2E_TMP/cxx.log")"
said='libpdx engine: send: this engine has not registered its KV memory yet'
cxx() { LD_LIBRARY_PATH=$libdir "$E2E_TMP/cxx" "ipc://$E2E_TMP/nobody" "$@" 2>"$E2E_TMP/cxx.err" ||
	fail "C++ program: exit $?: $(cat "$E2E_TMP/cxx.err")"; }
cxx
grep -q "$said" "$E2E_TMP/cxx.err" || fail "no warning from libpdx: $(cat "$E2E_TMP/cxx.err")"
PDX_LOG_LEVEL=error cxx
! grep -q "$said" "$E2E_TMP/cxx.err" || fail "PDX_LOG_LEVEL=error: $(cat "$E2E_TMP/cxx.err")"
PDX_LOG_LEVEL=error cxx warn
grep -q "$said" "$E2E_TMP/cxx.err" || fail "set_log_level(warn) after PDX_LOG_LEVEL=error: $(cat "$E2E_TMP/cxx.err")"

cc -Wall -Wextra -Werror "${FLAGS[@]}" "$SRC/tests/outside/transfer.c" -o "$E2E_TMP/transfer" \
	$cflags $libs 2>"$E2E_TMP/cc.log" || fail "cc transfer.c: $(cat "$E2E_TMP/cc.log")"

AGENT=$ROOT$prefix/bin/pdx-agent
found=$(ldd "$AGENT" | awk '$1 == "libpdx.so.0" { print $3 }')
[ -n "$found" ] && [ "$(realpath "$found")" = "$(realpath "$so")" ] ||
	fail "the installed agent does not find the installed libpdx: $(ldd "$AGENT" | grep pdx)"
agent_start p
agent_start d
LD_LIBRARY_PATH=$libdir timeout 60 "$E2E_TMP/transfer" \
	"ipc://$E2E_TMP/p.engine" "ipc://$E2E_TMP/d.engine" >"$E2E_TMP/transfer.log" 2>&1 ||
	fail "transfer: $(tail -20 "$E2E_TMP/transfer.log"; tail -5 "$E2E_TMP"/agent_*.log)"
cat "$E2E_TMP/transfer.log"
named_stop agent_p
named_stop agent_d
echo "libpdx_install: ok"
