#!/usr/bin/env python3
"""Prints two pdx-bench results side by side, with their differences;
optionally writes both into one JSON file and draws their TTFT and ITL
distributions with gnuplot.

usage: demo_report.py DISAGG.json COLOC.json [--flow F] [--json FILE]
                      [--plot FILE.png]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROWS = [
    ("Successful requests", "completed", "{:.0f}"),
    ("Failed requests", "failed", "{:.0f}"),
    ("Benchmark duration (s)", "duration", "{:.2f}"),
    ("Request throughput (req/s)", "request_throughput", "{:.2f}"),
    ("Output token throughput (tok/s)", "output_throughput", "{:.1f}"),
    ("Total token throughput (tok/s)", "total_token_throughput", "{:.1f}"),
]
METRICS = [("TTFT", "ttft"), ("TPOT", "tpot"), ("ITL", "itl"), ("E2EL", "e2el")]


def rows(a, b):
    for label, key, fmt in ROWS:
        yield label, key, fmt
    for name, m in METRICS:
        for stat in ("mean", "median", "p90", "p99"):
            key = f"{stat}_{m}_ms"
            if key in a and key in b:
                yield f"{stat.capitalize()} {name} (ms)", key, "{:.2f}"


def report(a, b, flow):
    width = 34
    print()
    title = f" pdx demo: disaggregated ({flow} flow) vs colocated "
    print(title.center(width + 48, "="))
    print(f"{'':<{width}}{'disaggregated':>14}{'colocated':>12}"
          f"{'difference':>12}{'':>10}")
    for label, key, fmt in rows(a, b):
        x, y = a.get(key), b.get(key)
        if x is None or y is None:
            continue
        d = x - y
        pct = f"{100 * d / y:+.1f}%" if y else ""
        print(f"{label:<{width}}{fmt.format(x):>14}{fmt.format(y):>12}"
              f"{('+' if d >= 0 else '') + fmt.format(d):>12}{pct:>10}")
    print("=" * (width + 48))
    if "mean_ttft_ms" in a and "mean_ttft_ms" in b:
        d = a["mean_ttft_ms"] - b["mean_ttft_ms"]
        print(f"The disaggregated system's mean TTFT is {abs(d):.2f} ms "
              f"{'above' if d >= 0 else 'below'} the colocated engine's.")


def cdf_file(d, name, values):
    path = os.path.join(d, name)
    values = sorted(v * 1000 for v in values)
    with open(path, "w") as f:
        for i, v in enumerate(values):
            f.write(f"{v} {(i + 1) / len(values)}\n")
    return path


def plot(a, b, out):
    gnuplot = shutil.which("gnuplot")
    if not gnuplot:
        print("demo: no gnuplot: no plot (apt-get install gnuplot-nox)",
              file=sys.stderr)
        return
    with tempfile.TemporaryDirectory() as d:
        files = {}
        for tag, r in (("disagg", a), ("coloc", b)):
            itls = [x for per in r.get("itls", []) for x in per]
            files[tag + "_ttft"] = cdf_file(d, tag + "_ttft", r.get("ttfts", []))
            files[tag + "_itl"] = cdf_file(d, tag + "_itl", itls)
        script = f"""
set terminal pngcairo size 1200,500 noenhanced
set output '{out}'
set multiplot layout 1,2
set grid
set key bottom right
set ylabel 'fraction of requests'
set xlabel 'time to first token (ms)'
set title 'TTFT'
plot '{files["disagg_ttft"]}' using 1:2 with steps lw 2 title 'disaggregated', \\
     '{files["coloc_ttft"]}' using 1:2 with steps lw 2 title 'colocated'
set ylabel 'fraction of token gaps'
set xlabel 'inter-token latency (ms)'
set title 'ITL'
plot '{files["disagg_itl"]}' using 1:2 with steps lw 2 title 'disaggregated', \\
     '{files["coloc_itl"]}' using 1:2 with steps lw 2 title 'colocated'
unset multiplot
"""
        r = subprocess.run([gnuplot], input=script, text=True,
                           capture_output=True)
        if r.returncode:
            print(f"demo: gnuplot failed: {r.stderr.strip()}", file=sys.stderr)
            return
    print(f"plot: {out}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("disaggregated")
    ap.add_argument("colocated")
    ap.add_argument("--flow", default="concurrent")
    ap.add_argument("--json", default="")
    ap.add_argument("--plot", default="")
    o = ap.parse_args()
    a = json.load(open(o.disaggregated))
    b = json.load(open(o.colocated))
    report(a, b, o.flow)
    if o.json:
        with open(o.json, "w") as f:
            json.dump({"disaggregated": a, "colocated": b}, f, indent=1)
        print(f"results: {o.json}")
    if o.plot:
        plot(a, b, o.plot)


if __name__ == "__main__":
    main()
