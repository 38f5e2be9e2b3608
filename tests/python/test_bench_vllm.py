"""scripts/bench-vllm keeps working: a tiny run (the tiny model, 64
tokens, two repetitions a side, three more transfers for the control
path) exits 0, every transfer byte-exact, both sides measured on the
decode agent's clock, and every connector call that carries a transfer
timed once per transfer (per layer for save_kv_layer).

usage: test_bench_vllm.py PDX_AGENT PDX_ENGINE
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "scripts", "bench-vllm")
LAYERS, REPS, MORE = 4, 2, 3   # tiny: 4 layers


def main():
    agent, engine = sys.argv[1:3]
    with tempfile.TemporaryDirectory(prefix="pdx-bv-") as tmp:
        out = os.path.join(tmp, "out.json")
        p = subprocess.run(
            [sys.executable, SCRIPT, "--agent-bin", agent, "--engine-bin",
             engine, "--model", "tiny", "--tokens", "64", "--reps",
             str(REPS), "--control-transfers", str(MORE), "--json", out],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            timeout=240)
        print(p.stdout)
        assert p.returncode == 0, "exit %d" % p.returncode
        with open(out) as f:
            r = json.load(f)
    assert r["exact"] is True, r
    assert r["bytes"] == 64 * LAYERS * 2 * 2 * 16 * 2, r["bytes"]
    for side in ("vllm", "engine"):
        rates = r[side + "_gbps_all"]
        assert len(rates) == REPS and all(x > 0 for x in rates), r
    assert r["ratio"] > 0 and len(r["pair_ratios"]) == REPS, r
    assert r["data_by"] and "" not in r["data_by"], r["data_by"]
    n = REPS + MORE + 1            # the warm-up's transfer is not timed
    assert r["control_transfers"] == REPS + MORE, r["control_transfers"]
    c = r["control"]
    for call in ("build_connector_meta", "bind_connector_metadata",
                 "start_load_kv", "wait_for_save", "get_finished",
                 "request_finished"):
        assert c[call]["n"] == n - 1, (call, c[call])
        assert 0 < c[call]["median_us"] <= c[call]["p99_us"], (call, c[call])
    assert c["save_kv_layer"]["n"] == (n - 1) * LAYERS, c["save_kv_layer"]
    assert c["per_transfer_median_us"] > 0, c
    print("ok: bench-vllm ran, byte-exact, %.2f x engine's rate" %
          r["ratio"])


if __name__ == "__main__":
    main()
