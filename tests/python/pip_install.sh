#!/usr/bin/env bash
# `pip install ./python` works offline (no build isolation: Debian's
# setuptools; no index) and the installed package, away from the source
# tree, drives a real agent: connect and register through libpdx.
#   pip_install.sh SOURCE_ROOT PATH-TO-pdx-agent   (PDX_LIBRARY set)
set -eu
src=$1 agent=$2
tmp=$(mktemp -d)
trap 'kill $apid 2>/dev/null; wait $apid 2>/dev/null; rm -rf "$tmp"' EXIT
apid=
/usr/bin/python3 -m pip --version >/dev/null 2>&1 ||
	{ echo "# skip: no pip for /usr/bin/python3"; exit 77; }
cp -r "$src/python" "$tmp/src" # the build leaves nothing in the tree
/usr/bin/python3 -m pip install --quiet --no-index --no-build-isolation \
	--no-warn-script-location --target "$tmp/site" "$tmp/src" 2>"$tmp/pip.err" ||
	{ cat "$tmp/pip.err"; echo "FAIL: pip install ./python"; exit 1; }
"$agent" --engine "ipc://$tmp/a.engine" --listen "tcp://127.0.0.1:0" \
	2>"$tmp/agent.log" &
apid=$!
for _ in $(seq 100); do [ -S "$tmp/a.engine" ] && break; sleep 0.1; done
cd "$tmp" && PYTHONPATH="$tmp/site" /usr/bin/python3 - "$tmp" <<'PY'
import sys
import pdx
assert pdx.__file__.startswith(sys.argv[1] + "/site/"), pdx.__file__
from pdx.vllm import layout  # the connector's modules are installed too
import pdx.sglang  # and the SGLang backend's
pool = pdx.SharedPool(4 * 2 * 64 * 256)
lay = pdx.Layout(blocks=64, block_tokens=4, kv_heads=2, head_dim=16,
                 dtype_bytes=2, bases=[[(0, (2 * l + t) * 64 * 256)
                                        for t in range(2)] for l in range(4)],
                 block_stride=[256] * 4)
with pdx.Engine("ipc://%s/a.engine" % sys.argv[1]) as e:
    peer = e.register(lay, [pool.region])
    assert peer.startswith("tcp://127.0.0.1:") and not peer.endswith(":0"), peer
pool.close()
print("ok   the pip-installed package registers with a real agent:", peer)
PY
# the package's version is the project's (pyproject.toml said 0.2.0 when
# pdx was 0.4.0)
want=$(sed -n "s/^  version: '\(.*\)',$/\1/p" "$src/meson.build")
got=$(PYTHONPATH="$tmp/site" /usr/bin/python3 -c \
	'import importlib.metadata as m; print(m.version("pdx"))')
[ "$got" = "$want" ] ||
	{ echo "FAIL: the pip-installed pdx is $got, meson.build's $want"; exit 1; }
echo "ok   the pip-installed package's version is pdx's: $got"
# SGLang's plugin framework finds the hook by its entry point; without
# PDX_SGLANG it installs nothing (it imports nothing of SGLang)
PYTHONPATH="$tmp/site" /usr/bin/python3 - <<'PY'
import importlib.metadata as m
import sys
eps = [e for e in m.entry_points(group="sglang.srt.plugins")
       if e.name == "pdx"]
assert len(eps) == 1, eps
import pdx.sglang.hook
assert eps[0].load() is pdx.sglang.hook.plugin, eps[0]
eps[0].load()()
assert not any(n.startswith("sglang") for n in sys.modules), "sglang imported"
print("ok   SGLang's plugin entry point: pdx.sglang.hook:plugin")
PY
