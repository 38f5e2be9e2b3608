#!/usr/bin/python3
"""agent_calls: no file of agent/ calls, directly or through others, a file
that calls it back (docs/architecture.md, "Inside the agent").

Read from the code: a file "calls" another when it names a function or
table defined there (not static). Reaching up through a pointer another
file installed (xfer_ops, agent->settle, a peer's data_path_ops, a UCX
callback) is not a call: that is how a lower file reports without
knowing who is above it. Prints each circle, with its edges.

    agent_calls.py AGENT-DIR

Exits 0 when there is none, 1 otherwise.
"""
import glob
import os
import re
import sys

KEYWORDS = {"if", "while", "for", "switch", "return", "sizeof"}


def strip(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    text = re.sub(r"'(\\.|[^'\\])'", "0", text)
    return re.sub(r'"(\\.|[^"\\])*"', '""', text)


def definitions(text):
    """Names a file defines for others: non-static functions and data."""
    names = set()
    for m in re.finditer(r"^(?!static\b)(?!typedef\b)[A-Za-z_][\w \*]*?\b(\w+)\s*\(",
                         text, flags=re.M):
        if m.group(1) not in KEYWORDS:
            names.add(m.group(1))
    for m in re.finditer(r"^(?!static\b)(?:const\s+)?struct\s+\w+\s+(\w+)\s*=",
                         text, flags=re.M):
        names.add(m.group(1))
    return names


def graph(agent_dir):
    files = sorted(glob.glob(os.path.join(agent_dir, "*.c")))
    # gpu_nocuda.c is gpu_cuda.c's twin where there is no CUDA: one node
    node = {f: os.path.basename(f).replace("gpu_nocuda.c", "gpu_cuda.c")
            for f in files}
    text = {f: strip(open(f).read()) for f in files}
    owner = {}
    for f in files:
        for name in definitions(text[f]):
            owner.setdefault(name, node[f])
    edges = {n: set() for n in node.values()}
    for f in files:
        for name in set(re.findall(r"\b\w+\b", text[f])):
            o = owner.get(name)
            if o and o != node[f]:
                edges[node[f]].add(o)
    return edges


def circles(edges):
    """Tarjan's strongly connected parts of more than one file."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                out.append(sorted(part))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def main():
    edges = graph(sys.argv[1])
    if len(edges) < 10:
        print(f"only {len(edges)} files in {sys.argv[1]}: wrong directory?")
        return 1
    found = circles(edges)
    for part in found:
        print("FAIL: these files call each other in a circle:", " ".join(part))
        for f in part:
            print(f"    {f} -> {' '.join(sorted(g for g in edges[f] if g in part))}")
    if not found:
        print(f"ok: {len(edges)} files of {sys.argv[1]}, none calls back up")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
