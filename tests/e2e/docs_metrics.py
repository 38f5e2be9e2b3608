#!/usr/bin/python3
"""docs_metrics: a process's /metrics against the table that documents
it (docs/architecture.md's for pdx-agent, engine.md's for pdx-engine,
proxy.md's for pdx-proxy): a row of `| name | type | labels and meaning |`
per family.

Every family scraped is in the table with its type; each of its labels
(`le` aside) is named in its row or in the text around the table, and where the row lists a label's
values (`` `key`: `a`, `b` ``) every value scraped is among them (those
of `instance`, `name`, `code` and `model_name` are free). Every family
in the table is scraped, unless its row says it appears "only with"
some option.

usage: docs_metrics.py SCRAPE-FILE DOC-FILE "SECTION HEADING"

Prints each difference; exits 0 when there is none, 1 otherwise.
"""
import re
import sys

FREE = {"instance", "name", "code", "model_name"}
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? \S+$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def scraped(text):
    """{family: (type, {label: {values}})} from an exposition."""
    fams = {}
    for line in text.splitlines():
        m = re.match(r"^# TYPE (\S+) (\S+)$", line)
        if m:
            fams[m.group(1)] = (m.group(2), {})
            continue
        m = SAMPLE.match(line)
        if not m:
            continue
        name = m.group(1)
        if name not in fams:
            name = re.sub(r"_(bucket|sum|count)$", "", name)
        labels = fams[name][1]
        for k, v in LABEL.findall(m.group(2) or ""):
            if k != "le":
                labels.setdefault(k, set()).add(v)
    return fams


def documented(doc, heading):
    """{family: (type, row text)} from the table under heading."""
    start = doc.index("\n" + heading + "\n")
    level = heading.split(" ")[0]
    end = re.search(r"^#{1,%d} " % len(level), doc[start + len(heading) + 2:],
                    flags=re.M)
    section = doc[start:start + len(heading) + 2 + end.start()] if end \
        else doc[start:]
    rows, prose = {}, ""
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and re.fullmatch(r"`[a-z_:]+`", cells[0]):
            rows[cells[0].strip("`")] = (cells[1], " | ".join(cells[2:]))
        elif not line.startswith("|"):
            prose += line + " "
    # a label the text around the table names ("every family has the
    # one label `model_name`") is every row's
    return {k: (t, row + " | " + prose) for k, (t, row) in rows.items()}


def main():
    scrape_file, doc_file, heading = sys.argv[1:4]
    with open(scrape_file) as f:
        got = scraped(f.read())
    with open(doc_file) as f:
        want = documented(f.read(), heading)
    bad = []
    for fam, (typ, labels) in sorted(got.items()):
        if fam not in want:
            bad.append("%s (%s) is not in %s, %r" % (fam, typ, doc_file, heading))
            continue
        dtyp, row = want[fam]
        if dtyp != typ:
            bad.append("%s: %s, documented as %s" % (fam, typ, dtyp))
        for key, values in sorted(labels.items()):
            if "`%s`" % key not in row:
                bad.append("%s: label %s is not documented" % (fam, key))
                continue
            if key in FREE or "`%s`:" % key not in row:
                continue
            for v in sorted(values):
                if "`%s`" % v not in row:
                    bad.append("%s: %s=%r is not documented" % (fam, key, v))
    for fam, (_, row) in sorted(want.items()):
        if fam not in got and "only with" not in row:
            bad.append("%s is documented but not scraped" % fam)
    for b in bad:
        print("FAIL:", b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
