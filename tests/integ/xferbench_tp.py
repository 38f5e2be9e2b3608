#!/usr/bin/python3
"""xferbench_tp: pdx-xferbench --prefill-tp P --decode-tp D on the host ipc
lane: one agent and engine per rank, each pool holding its share of the
KV heads (MLA: the whole latent), the agents resharding between the two
sizes. Every decode rank is checked byte for byte against the heads it
holds and must report the bytes of its slice; --versus tp measures P -> D
beside P -> P (the same total bytes between equal TP sizes) in one run,
its time ratio in the JSON; the am lane over TCP and pulls move heads
too. No timing threshold: this machine is shared.
Refused splits exit 2.

    xferbench_tp.py PDX-XFERBENCH PDX-AGENT
"""
import json
import sys

from xb_check import CONC, ITERS, check, finish, run

# common/models.c: (layers, tensors, kv_heads, head_dim, block_tokens)
MODELS = {"tiny": (4, 2, 2, 16, 4), "llama3-8b": (32, 2, 8, 128, 16),
          "deepseek-v3": (61, 1, 1, 576, 64)}


def full_bytes(model, tokens):
    """One transfer's KV, every head once."""
    layers, tensors, heads, head_dim, bt = MODELS[model]
    return ((tokens + bt - 1) // bt) * bt * layers * tensors * heads * \
        head_dim * 2


def check_arm(name, arm, model, tokens, p, d):
    """An arm (or the top level) moved P -> D: each decode rank its slice,
    all verified."""
    mla = MODELS[model][1] == 1
    rank_bytes = full_bytes(model, tokens) // (1 if mla else d)
    check(arm.get("prefill_tp") == p and arm.get("decode_tp") == d,
          "%s: TP %r -> %r, want %d -> %d" % (name, arm.get("prefill_tp"),
                                              arm.get("decode_tp"), p, d))
    check(arm.get("verified") is True, "%s: not verified" % name)
    ranks = arm.get("decode_ranks") or []
    check([r.get("rank") for r in ranks] == list(range(d)),
          "%s: decode_ranks %r, want ranks 0..%d" % (name, ranks, d - 1))
    for r in ranks:
        check(r.get("verified") is True, "%s: decode rank %r not verified"
              % (name, r.get("rank")))
        check(r.get("bytes") == rank_bytes and
              r.get("event_bytes") == rank_bytes,
              "%s: decode rank %r: bytes %r, its agent said %r, want %d" %
              (name, r.get("rank"), r.get("bytes"), r.get("event_bytes"),
               rank_bytes))
    check(arm.get("bytes") == rank_bytes * d,
          "%s: bytes %r, want %d" % (name, arm.get("bytes"), rank_bytes * d))


def check_plain(xb, agent, model, tokens, p, d, order="NHD", more=()):
    """P -> D alone (more: further options, e.g. the lane or --pull)."""
    r = json.loads(run(xb, agent, ["--model", model, "--tokens", str(tokens),
                                   "--prefill-tp", str(p), "--decode-tp",
                                   str(d), "--order", order, "--json"] +
                       list(more)).stdout)
    name = "%s %s TP %d -> %d %s" % (model, order, p, d, " ".join(more))
    check_arm(name, r, model, tokens, p, d)
    check(r.get("order") == order and r.get("versus") is None,
          "%s: order %r versus %r" % (name, r.get("order"), r.get("versus")))
    check(r.get("xfers") == ITERS * CONC, "%s: %r transfers measured" %
          (name, r.get("xfers")))
    print("ok: %s: %r bytes a transfer, p50 %r ms" % (name, r.get("bytes"),
                                                     r.get("p50_ms")))


def check_versus(xb, agent, model, tokens, p, d):
    """P -> D beside P -> P in one run."""
    r = json.loads(run(xb, agent, ["--model", model, "--tokens", str(tokens),
                                   "--prefill-tp", str(p), "--decode-tp",
                                   str(d), "--versus", "tp",
                                   "--json"]).stdout)
    name = "%s --versus tp %d -> %d" % (model, p, d)
    v = r.get("versus")
    check(isinstance(v, dict) and v.get("what") == "tp",
          "%s: versus = %r" % (name, v))
    if not isinstance(v, dict):
        return
    base, var = v.get("baseline", {}), v.get("variant", {})
    check_arm(name + " baseline", base, model, tokens, p, p)
    check_arm(name + " variant", var, model, tokens, p, d)
    # the top level is the baseline's, as for every --versus
    check_arm(name + " top level", r, model, tokens, p, p)
    check(r["verified"] is True, "%s: verified = %r" % (name, r["verified"]))
    check(v.get("bytes_ratio") == 1, "%s: bytes_ratio = %r, want 1" %
          (name, v.get("bytes_ratio")))
    want = var["p50_ms"] / base["p50_ms"] if base.get("p50_ms") else 0
    check(isinstance(v.get("time_ratio"), (int, float)) and
          v["time_ratio"] > 0 and
          abs(v["time_ratio"] - want) <= 0.001 + 0.01 * want,
          "%s: time_ratio = %r, want %.4f" % (name, v.get("time_ratio"),
                                              want))
    print("ok: %s: time_ratio %r" % (name, v.get("time_ratio")))


def main():
    xb, agent = sys.argv[1], sys.argv[2]
    check_versus(xb, agent, "tiny", 64, 1, 2)
    check_versus(xb, agent, "tiny", 64, 2, 1)
    check_versus(xb, agent, "llama3-8b", 64, 2, 4)
    check_versus(xb, agent, "llama3-8b", 64, 4, 2)
    check_plain(xb, agent, "tiny", 62, 1, 2, "HND")
    check_plain(xb, agent, "tiny", 62, 2, 1, "HND")
    check_plain(xb, agent, "tiny", 64, 2, 2)
    # MLA: every decode rank receives the whole latent
    check_plain(xb, agent, "deepseek-v3", 100, 2, 1)
    check_plain(xb, agent, "deepseek-v3", 100, 1, 2)
    # the am lane over TCP packs the heads; 1024 tokens put more packed
    # bytes in flight than the agent's bound (slice_bufs.c), so layers wait
    check_plain(xb, agent, "llama3-8b", 1024, 2, 4, "NHD",
                ["--data-path", "am", "--tls", "tcp"])
    check_plain(xb, agent, "llama3-8b", 1024, 4, 2, "HND",
                ["--data-path", "am", "--tls", "tcp"])
    # pulled: the decode agents read their heads
    check_plain(xb, agent, "llama3-8b", 256, 2, 4, "NHD", ["--pull"])
    check_plain(xb, agent, "tiny", 62, 2, 1, "HND",
                ["--pull", "--data-path", "put"])
    # pulled NHD legs on the put lane read whole blocks into buffers
    # under the same bound: 1024 tokens' buffers wait for room there too
    check_plain(xb, agent, "llama3-8b", 1024, 2, 4, "NHD",
                ["--pull", "--data-path", "put"])

    out = run(xb, agent, ["--model", "tiny", "--tokens", "64",
                          "--prefill-tp", "2", "--decode-tp", "1",
                          "--versus", "tp"]).stdout
    check("versus tp" in out and "TP prefill -> decode" in out and
          "2 -> 1" in out, "the console output has no TP table:\n" + out)
    for bad in (["--prefill-tp", "3"], ["--decode-tp", "4"],
                ["--prefill-tp", "16"], ["--versus", "tp"],
                ["--prefill-tp", "2", "--decode-tp", "2", "--versus", "tp"],
                ["--decode-tp", "2", "--one-block", "5"],
                ["--order", "XYZ"]):
        run(xb, agent, ["--model", "tiny", "--tokens", "64"] + bad, 2)
    finish()


main()
