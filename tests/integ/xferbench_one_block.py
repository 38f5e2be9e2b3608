#!/usr/bin/python3
"""xferbench_one_block: pdx-xferbench --one-block, briefly, on the host
ipc lane: its JSON carries the one-block control path beside the ping over
the decode agent's engine link, and the breakdown from the agents' trace
lines, all well formed (counts, order of percentiles, the steps adding up
to the whole); the trace lines stay out of stderr; without --one-block the
keys are null. No timing threshold: this machine is shared.

    xferbench_one_block.py PDX-XFERBENCH PDX-AGENT
"""
import json
import subprocess
import sys

from xb_check import check, finish

N = 30
STEPS = ["engine_link_prefill", "to_push", "push", "completion",
         "done_build", "peer_link", "decode_agent", "engine_link_decode"]


def run(xb, agent, extra):
    p = subprocess.run([xb, "--model", "tiny", "--tokens", "16", "--iters",
                        "1", "--json", "--agent-bin", agent] + extra,
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        sys.stderr.write(p.stderr)
        sys.exit("pdx-xferbench %s exited %d" % (extra, p.returncode))
    return json.loads(p.stdout), p.stderr


def check_stat(r, key, n):
    s = r.get(key)
    check(isinstance(s, dict), "%s: want an object, got %r" % (key, s))
    if not isinstance(s, dict):
        return
    check(s.get("n") == n, "%s.n = %r, want %d" % (key, s.get("n"), n))
    check(0 < s["p50"] <= s["p90"], "%s: want 0 < p50 <= p90: %r" % (key, s))
    check(s["mean"] > 0, "%s.mean = %r" % (key, s["mean"]))


def main():
    xb, agent = sys.argv[1], sys.argv[2]
    r, err = run(xb, agent, ["--one-block", str(N)])
    check(r["verified"] is True, "verified = %r" % r["verified"])
    check_stat(r, "one_block_ctl_us", N)
    check_stat(r, "zmq_rtt_us", N)
    ratio = r.get("one_block_ratio")
    want = (r["one_block_ctl_us"]["p50"] / r["zmq_rtt_us"]["p50"]
            if r["zmq_rtt_us"]["p50"] else 0)
    check(isinstance(ratio, float) and abs(ratio - want) < 0.01,
          "one_block_ratio = %r, want ctl p50 / rtt p50 = %.3f" % (ratio, want))
    b = r.get("one_block_breakdown_us")
    check(isinstance(b, dict), "one_block_breakdown_us = %r" % b)
    if isinstance(b, dict):
        check(b.get("n") == N, "breakdown n = %r, want %d (every transfer "
              "traced)" % (b.get("n"), N))
        check([k for k in b if k != "n"] == STEPS,
              "breakdown steps %r, want %r" % (list(b), STEPS))
        total = sum(b[k]["mean"] for k in STEPS if k in b)
        ctl = r["one_block_ctl_us"]["mean"]
        check(all(b[k]["mean"] >= 0 and b[k]["p50"] >= 0 for k in STEPS
                  if k in b), "a step took negative time: %r" % b)
        # rounded to 0.1 us each
        check(abs(total - ctl) <= 0.1 * len(STEPS) + 0.1,
              "the steps' means add up to %.1f us, the whole to %.1f" %
              (total, ctl))
    check(" trace: " not in err, "trace lines were copied to stderr")
    summary = "ok: one-block control path %.1f us p50, ping %.1f us p50" % (
        r["one_block_ctl_us"]["p50"], r["zmq_rtt_us"]["p50"])

    one_block_bytes = r["bytes"]
    r, _ = run(xb, agent, [])
    check(one_block_bytes == r["bytes"],
          "bytes per transfer %r with --one-block, %r without: the one-block "
          "transfers after the run must not change the run's figure" %
          (one_block_bytes, r["bytes"]))
    for key in ["one_block_ctl_us", "zmq_rtt_us", "one_block_ratio",
                "one_block_breakdown_us"]:
        check(key in r and r[key] is None,
              "without --one-block, %s = %r, want null" % (key, r.get(key)))
    finish()
    print(summary)


main()
