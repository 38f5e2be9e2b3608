#!/usr/bin/python3
"""docs_options: every option of every program and script, as its --help
prints it and as its parser takes it, against docs/configuration.md.

For each program: the options its --help lists, those its option parser
knows (read from the code: getopt_long's table, the proxy's names, a
script's `case` labels) and those its section of docs/configuration.md
lists in its tables' first column must be the same (`--version`, which
the page's opening paragraph covers for every C program, may be left out
of a table); so must those of the options table on its own page
(docs/engine.md, docs/proxy.md), which may leave out --help too. A number the --help gives as an option's default must be
the default the docs give it. And each option that takes a value, given
without one, exits 2 with a reason on stderr, having started nothing.

    docs_options.py SOURCE-ROOT BUILD-ROOT

Prints every difference; exits 0 when there is none, 1 otherwise.
"""
import os
import re
import signal
import subprocess
import sys

OPT = r"--[a-z][a-z0-9-]*"


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def help_options(text):
    """{option: its help text}: the options of a usage text, from the
    first column of its option lines (an option, or several separated by
    commas, then two spaces and the meaning); an option's text runs on
    the lines below that do not start another."""
    opts, last = {}, None
    for line in text.splitlines():
        m = re.match(r"^ {1,4}(-\S.*?)(?: {2,}(.*))?$", line)
        if m and re.match(r"-(-|h)", m.group(1)):
            last = re.findall(OPT, m.group(1))
            for o in last:
                opts[o] = m.group(2) or ""
            continue
        if last and line.startswith(" " * 8) and line.strip():
            for o in last:
                opts[o] += " " + line.strip()
        else:
            last = None
    return opts


def c_parser_options(text):
    """Long options a C parser takes: getopt_long's table
    ({"name", ...}) and names compared by hand ("--name")."""
    names = {"--" + n for n in
             re.findall(r'\{\s*"([a-z][a-z0-9-]*)",\s*(?:no|required|optional)_argument',
                        text)}
    names |= set(re.findall(r'"(' + OPT + r')"', text))
    return names


def script_parser_options(text):
    """Options a shell script's `case` takes (labels like --name) | ...)),
    or a Python script's argparse (which takes --help itself)."""
    if text.startswith("#!/usr/bin/env python3") or \
            text.startswith("#!/usr/bin/python3"):
        return {"--help"} | set(re.findall(
            r'add_argument\(\s*"(' + OPT + ')"', text))
    names = set()
    for m in re.finditer(r"^\s*((?:-h ?\| ?)?--[a-z][a-z0-9-]*(?: ?\| ?--?[a-z-]+)*)\)",
                         text, flags=re.M):
        names |= set(re.findall(OPT, m.group(1)))
    return names


def doc_section(doc, heading):
    """The text of one section of configuration.md: from its heading to
    the next heading of the same or a higher level."""
    level = len(heading) - len(heading.lstrip("#"))
    start = doc.index("\n" + heading + "\n")
    rest = doc[start + len(heading) + 2:]
    m = re.search(r"^#{1,%d} " % level, rest, flags=re.M)
    return rest[:m.start()] if m else rest


def doc_options(section):
    """{option: its default cell}: every option in the first column of
    the section's option tables."""
    opts = {}
    for line in section.splitlines():
        cells = [c.strip() for c in
                 line.replace("\\|", "/").strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 2:
            continue
        for o in re.findall(OPT, cells[0]):
            opts[o] = cells[1] if len(cells) > 2 else ""
    return opts


def table_first_cells(section):
    """The first cells of a section's option rows, backticks dropped."""
    return [line.strip("|").split("|")[0].strip().replace("`", "")
            for line in section.splitlines()
            if re.match(r"^\| `-", line)]


def help_default(meaning):
    """The number a --help text gives as the option's default, if one."""
    m = re.search(r"\(?default:? (-?[0-9][0-9.]*)\b", meaning)
    return m.group(1) if m else None


def takes_value(help_line, parser_src, opt):
    """Whether an option takes a value, from its --help line: a word in
    capitals (or a|b choice) follows it."""
    return re.search(re.escape(opt) + r"[ =]([A-Z]|[a-z]+\|)", help_line) is not None


class Check:
    def __init__(self):
        self.bad = []

    def fail(self, what):
        self.bad.append(what)
        print("FAIL:", what)


def check_doc(chk, name, helped, where, section, may_omit):
    """One doc's table of a program's options against its --help."""
    documented = doc_options(section)
    h, d = set(helped), set(documented)
    for o in sorted(h - d - may_omit):
        chk.fail("%s: %s is missing from %s" % (name, o, where))
    for o in sorted(d - h):
        chk.fail("%s: %s lists %s, which --help does not" % (name, where, o))
    for o in sorted(h & d):
        want = help_default(helped[o])
        # --mem's "(default 0)" is its device number's
        if want is None or o == "--mem":
            continue
        cell = documented[o].replace("`", "")
        if not re.search(r"(?<![0-9.])" + re.escape(want) + r"(?![0-9])", cell):
            chk.fail("%s %s: --help says default %s, %s says '%s'"
                     % (name, o, want, where, documented[o]))


def check_program(chk, name, argv, help_text, parser, docs, value_probe):
    """docs: (where, section text, options it may leave out) each."""
    helped = help_options(help_text)
    h, p = set(helped), set(parser)
    for o in sorted(p - h):
        chk.fail("%s: %s is taken but --help does not list it" % (name, o))
    for o in sorted(h - p):
        chk.fail("%s: --help lists %s, which the parser does not take" % (name, o))
    for where, section, may_omit in docs:
        check_doc(chk, name, helped, where, section, may_omit)
    if not value_probe:
        return
    line_of = {}
    for line in help_text.splitlines():
        for o in re.findall(OPT, line.strip().split("  ")[0]
                            if line.startswith("  ") else ""):
            line_of.setdefault(o, line)
    for o in sorted(h):
        if not takes_value(line_of.get(o, ""), None, o):
            continue
        r = run(argv + [o], 20)
        if r.returncode != 2 or not r.stderr.strip() or \
                re.search(r"unbound variable|Traceback", r.stderr):
            chk.fail("%s %s without its value: exit %d, stderr %r (want 2 "
                     "and a reason)" % (name, o, r.returncode,
                                       r.stderr.strip()[-200:]))


def run(argv, timeout):
    """Runs a program in its own process group, all of which is killed
    when it outlasts timeout (a script that took --help for "go" would
    start a whole deployment)."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         stdin=subprocess.DEVNULL, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return subprocess.CompletedProcess(argv, -9, out,
                                           err + "\n(killed after %d s)" % timeout)
    return subprocess.CompletedProcess(argv, p.returncode, out, err)


def run_help(argv):
    r = run(argv + ["--help"], 20)
    if r.returncode != 0:
        raise SystemExit("%s --help: exit %d: %s" % (" ".join(argv),
                                                    r.returncode, r.stderr))
    return r.stdout


def main():
    src, build = sys.argv[1], sys.argv[2]
    doc = read(os.path.join(src, "docs", "configuration.md"))
    chk = Check()
    conf = "docs/configuration.md"
    # a program's own page may list its options again: (page, heading)
    pages = {"pdx-engine": ("docs/engine.md", "### Options"),
             "pdx-proxy": ("docs/proxy.md", "## Options")}
    programs = [
        ("pdx-agent", "agent/pdx-agent", ["agent/main.c"]),
        ("pdx-engine", "engine/pdx-engine", ["engine/opts.c"]),
        ("pdx-proxy", "proxy/pdx-proxy", ["proxy/opts.c"]),
        ("pdx-bench", "bench/pdx-bench", ["bench/load_opts.c"]),
        ("pdx-xferbench", "bench/pdx-xferbench", ["bench/xb_opts.c"]),
    ]
    for name, exe, srcs in programs:
        argv = [os.path.join(build, exe)]
        parser = set()
        for s in srcs:
            parser |= c_parser_options(read(os.path.join(src, s)))
        docs = [(conf, doc_section(doc, "## " + name), {"--version"})]
        if name in pages:
            page, heading = pages[name]
            docs.append((page, doc_section(read(os.path.join(src, page)),
                                           heading),
                         {"--version", "--help"}))
        check_program(chk, name, argv, run_help(argv), parser, docs, True)
    # Scripts whose --help is their usage text (scripts/xferbench passes
    # its arguments to pdx-xferbench).
    for name in ("demo", "launch-xpyd", "image", "test", "soak",
                 "bench-vllm"):
        path = os.path.join(src, "scripts", name)
        # the Python ones under Debian's python3, as the docs say
        argv = (["/usr/bin/python3"] if read(path).startswith("#!/usr/bin/env python3")
                or read(path).startswith("#!/usr/bin/python3") else []) + [path]
        check_program(chk, "scripts/" + name, argv, run_help(argv),
                      script_parser_options(read(path)),
                      [(conf, doc_section(doc, "### scripts/" + name), set())],
                      True)
    # Scripts whose --help is their header comment, with no option
    # list: their parser against the docs' table (which stands in for
    # the list, so a value left out is probed too).
    for name in ("measure", "proxy-bench"):
        path = os.path.join(src, "scripts", name)
        section = doc_section(doc, "### scripts/" + name)
        run_help([path])
        listing = "\n".join("  %s  -" % cell for cell in table_first_cells(section))
        check_program(chk, "scripts/" + name, [path], listing,
                      script_parser_options(read(path)),
                      [(conf, section, set())], True)
    if chk.bad:
        print("%d difference(s)" % len(chk.bad))
        return 1
    print("every option agrees with docs/configuration.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
