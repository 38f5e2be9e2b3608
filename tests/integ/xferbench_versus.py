#!/usr/bin/python3
"""xferbench_versus: pdx-xferbench --versus, briefly, on the host ipc lane:
each mode measures the baseline and the variant in one run, both verified
byte for byte, and its JSON's versus object carries both arms and their
ratios. bytes_ratio is checked exactly against what the skip implies (the
bytes the decode agent said it received); no timing threshold: this machine
is shared. Without --versus the key is null; a variant that is no variant
is refused. --versus order: the variant's decode pools hold HND, the
agents convert each block, byte for byte.

    xferbench_versus.py PDX-XFERBENCH PDX-AGENT
"""
import json
import sys

from xb_check import CONC, ITERS, check, finish, run

BLOCK_TOKENS = {"tiny": 4, "deepseek-v3": 64}  # common/models.c
ARM_KEYS = ["skip_tokens", "pull", "bytes", "event_bytes", "xfers", "p50_ms",
            "mean_ms", "p99_ms", "gbps", "exposed_ms", "engine_exposed_ms",
            "memcpy_gbps", "verified", "prefill_tp", "decode_tp",
            "decode_order", "decode_ranks"]


def check_versus(xb, agent, model, tokens, what, skip, pull, order="NHD"):
    """One --versus run: the variant holds skip tokens, pulls if pull,
    and its decode pools hold their blocks in `order`."""
    args = ["--model", model, "--tokens", str(tokens), "--versus", what]
    r = json.loads(run(xb, agent, args + ["--json"]).stdout)
    v = r.get("versus")
    check(isinstance(v, dict), "%s: versus = %r" % (what, v))
    if not isinstance(v, dict):
        return
    check(v.get("what") == what, "versus.what = %r, want %r" %
          (v.get("what"), what))
    base, var = v.get("baseline", {}), v.get("variant", {})
    for name, arm in (("baseline", base), ("variant", var)):
        check(list(arm) == ARM_KEYS, "%s: %s keys %r" % (what, name,
                                                         list(arm)))
        check(arm.get("verified") is True, "%s: %s not verified" %
              (what, name))
        check(arm.get("xfers") == ITERS * CONC, "%s: %s measured %r "
              "transfers, want %d" % (what, name, arm.get("xfers"),
                                      ITERS * CONC))
        check(arm.get("event_bytes") == arm.get("bytes"),
              "%s: %s: the decode agent received %r bytes, the shape "
              "says %r" % (what, name, arm.get("event_bytes"),
                           arm.get("bytes")))
    check(r["verified"] is True, "%s: verified = %r" % (what, r["verified"]))
    # the top-level keys stay the run's own (the baseline's)
    check(r["bytes"] == base.get("bytes") and r["skip_tokens"] == 0 and
          r["pull"] is False, "%s: top-level keys are not the baseline's"
          % what)
    check(base.get("skip_tokens") == 0 and base.get("pull") is False,
          "%s: baseline %r" % (what, base))
    check(var.get("skip_tokens") == skip and var.get("pull") is pull,
          "%s: variant skip_tokens %r pull %r, want %d %r" %
          (what, var.get("skip_tokens"), var.get("pull"), skip, pull))
    check(r.get("order") == base.get("decode_order") == r.get("decode_order")
          == "NHD" and var.get("decode_order") == order,
          "%s: orders: the run's %r, decode %r, baseline's %r, variant's "
          "%r, want NHD but the variant's %s" %
          (what, r.get("order"), r.get("decode_order"),
           base.get("decode_order"), var.get("decode_order"), order))
    bt = BLOCK_TOKENS[model]
    nblocks = (tokens + bt - 1) // bt
    moved = nblocks - skip // bt
    check(base["bytes"] % nblocks == 0 and
          var["bytes"] == base["bytes"] // nblocks * moved,
          "%s: variant moved %r bytes, want %d of %d blocks of the "
          "baseline's %r" % (what, var["bytes"], moved, nblocks,
                             base["bytes"]))
    check(v.get("bytes_ratio") == moved / nblocks,
          "%s: bytes_ratio = %r, want %d/%d" % (what, v.get("bytes_ratio"),
                                               moved, nblocks))
    for key, num in (("time_ratio", "p50_ms"), ("mean_time_ratio", "mean_ms"),
                     ("exposed_ratio", "exposed_ms")):
        want = var[num] / base[num] if base[num] else 0
        check(isinstance(v.get(key), (int, float)) and
              abs(v[key] - want) <= 0.001 + 0.01 * want,
              "%s: %s = %r, want %s ratio %.4f" % (what, key, v.get(key),
                                                    num, want))
    print("ok: --versus %s: bytes_ratio %r, time_ratio %r" %
          (what, v.get("bytes_ratio"), v.get("time_ratio")))


def main():
    xb, agent = sys.argv[1], sys.argv[2]
    check_versus(xb, agent, "tiny", 256, "skip-half", 128, False)
    # a skip that ends inside a block: only whole blocks are held
    check_versus(xb, agent, "deepseek-v3", 300, "skip=100", 100, False)
    check_versus(xb, agent, "tiny", 256, "pull", 0, True)
    # the variant's decode blocks in the other order: the agents convert
    check_versus(xb, agent, "tiny", 256, "order", 0, False, "HND")

    out = run(xb, agent, ["--model", "tiny", "--tokens", "64", "--versus",
                          "skip-half"]).stdout
    check("versus skip-half" in out and "tokens held by decode" in out,
          "the console output has no versus table:\n" + out)
    r = json.loads(run(xb, agent, ["--model", "tiny", "--tokens", "64",
                                   "--json"]).stdout)
    check("versus" in r and r["versus"] is None,
          "without --versus, versus = %r, want null" % r.get("versus"))
    for bad in (["--versus", "pull", "--pull"],
                ["--versus", "skip-half", "--skip-tokens", "8"],
                ["--versus", "skip=64"], ["--versus", "tp"]):
        run(xb, agent, ["--model", "tiny", "--tokens", "64"] + bad, 2)
    finish()


main()
