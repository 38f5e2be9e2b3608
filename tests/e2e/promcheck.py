"""A strict reader of the Prometheus text exposition format (0.0.4), for
checking /metrics without promtool: every line is a comment (# HELP or
# TYPE), a sample, or empty; each family has one HELP and one TYPE before
its samples and appears in one block; names and labels are well formed;
histograms have increasing le buckets ending in +Inf, cumulative counts,
and _count equal to the +Inf bucket.

usage: promcheck.py FILE [NAME=VALUE ...]   (NAME: an exact sample,
labels included, whose value must equal VALUE)"""
import math
import re
import sys

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
SAMPLE = re.compile(r"^(%s)(\{(?:%s)(?:,%s)*\})? (\S+)( -?\d+)?$" % (NAME, LABEL, LABEL))
HELP = re.compile(r"^# HELP (%s) (.*)$" % NAME)
TYPE = re.compile(r"^# TYPE (%s) (counter|gauge|histogram|summary|untyped)$" % NAME)


def value(s):
    if s in ("+Inf", "-Inf", "NaN"):
        return float(s.replace("Inf", "inf").replace("NaN", "nan"))
    return float(s)


def check(text):
    assert text.endswith("\n"), "no final newline"
    types, helps, samples, done, current = {}, {}, {}, set(), None
    hist = {}
    for n, line in enumerate(text.split("\n")[:-1], 1):
        where = "line %d: %r" % (n, line)
        if not line:
            continue
        m = HELP.match(line)
        if m:
            assert m.group(1) not in helps, "second HELP: " + where
            helps[m.group(1)] = m.group(2)
            continue
        m = TYPE.match(line)
        if m:
            fam = m.group(1)
            assert fam not in types, "second TYPE: " + where
            if current:
                done.add(current)
            current = fam
            types[fam] = m.group(2)
            continue
        assert not line.startswith("#"), "bad comment: " + where
        m = SAMPLE.match(line)
        assert m, "bad sample: " + where
        name, labels, v = m.group(1), m.group(2) or "", value(m.group(3))
        fam = name
        if current and types[current] == "histogram":
            fam = re.sub(r"_(bucket|sum|count)$", "", name)
        assert fam == current, "sample outside its family block: " + where
        assert fam in helps, "no HELP for " + fam
        key = name + labels
        assert key not in samples, "duplicate sample: " + where
        samples[key] = v
        if types[fam] == "counter":
            assert v >= 0 and not math.isnan(v), "negative counter: " + where
        if name.endswith("_bucket") and types[fam] == "histogram":
            le = re.search(r'le="([^"]*)"', labels)
            assert le, "bucket without le: " + where
            # one series per label set other than le
            rest = re.sub(r',?le="[^"]*"', "", labels).replace("{,", "{")
            rest = "" if rest == "{}" else rest
            hist.setdefault((fam, rest), []).append((value(le.group(1)), v))
    for (fam, rest), buckets in hist.items():
        what = fam + rest
        les = [b[0] for b in buckets]
        assert les == sorted(les) and les[-1] == math.inf, what + ": le order"
        counts = [b[1] for b in buckets]
        assert counts == sorted(counts), what + ": buckets not cumulative"
        cnt = samples.get(fam + "_count" + rest)
        assert cnt == counts[-1], what + ": _count != +Inf bucket"
    return samples


samples = check(open(sys.argv[1]).read())
for want in sys.argv[2:]:
    k, v = want.rsplit("=", 1)
    assert k in samples, "missing " + k
    assert samples[k] == float(v), "%s is %g, want %s" % (k, samples[k], v)
