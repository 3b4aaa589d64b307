#!/usr/bin/env python3
"""Report import cycles between the modules of each crate in the workspace.

Checked at every level: among a crate's top-level modules, and among the children of every
folder module (a crate's rooms, e.g. proxy's `serving/`, `recording/`). A module depends on
a sibling when any file inside it names something inside the sibling (`crate::a::b`,
`super::b`, `self::b`, `use crate::{a, b}`). Test modules (`#[cfg(test)]` to the end of a
file, and files named `tests.rs` or `*_tests.rs`) are ignored: tests may reach anywhere.
Exit 1 if any crate has a cycle; print each strongly connected component of more than one
module.

    python3 scripts/module-cycles.py            # all crates
"""
import os, re, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def crates():
    import tomllib
    ws = tomllib.load(open(os.path.join(ROOT, "Cargo.toml"), "rb"))
    for m in ws["workspace"]["members"]:
        yield m, os.path.join(ROOT, m, "src")
    yield "llmreplay (bin)", os.path.join(ROOT, "src")


def files(src):
    """Every source file of a crate with its module path (a tuple; `mod.rs` is its folder's)."""
    for dirpath, _, fs in os.walk(src):
        for f in fs:
            if not f.endswith(".rs"):
                continue
            path = os.path.join(dirpath, f)
            parts = tuple(os.path.relpath(path, src)[:-3].split(os.sep))
            if parts[-1] == "mod":
                parts = parts[:-1]
            if parts in (("lib",), ("main",)) or not parts:
                continue
            if parts[-1] == "tests" or parts[-1].endswith("_tests"):
                continue
            yield parts, path


def strip_tests(text):
    m = re.search(r"^#\[cfg\(test\)\]\s*\n\s*mod\s+\w+\s*\{", text, re.M)
    return text[: m.start()] if m else text


def references(me, path):
    """The module paths a file names: `crate::a::b`, `super::a`, `self::a` and
    `use crate::{a, b::c}` groups, resolved against the file's own module path `me`."""
    text = strip_tests(open(path).read())
    text = re.sub(r"//[^\n]*", "", text)
    out = set()
    for m in re.finditer(r"\b(crate|super|self)((?:::\w+)+)", text):
        base = {"crate": (), "super": me[:-1], "self": me}[m.group(1)]
        out.add(base + tuple(m.group(2).split("::")[1:]))
    for g in re.finditer(r"\bcrate::\{([^}]*)\}", text):
        for n in re.findall(r"(?:^|[,{\s])(\w+)", g.group(1)):
            out.add((n,))
    return out


def graphs(src):
    """For every folder of modules (the crate root included), the import graph among its
    children: an edge c -> d when a file inside child c names something inside sibling d."""
    mods = dict(files(src))
    known = set(mods)
    for m in list(known):
        for i in range(1, len(m)):
            known.add(m[:i])
    out = {}
    for parent in {m[:-1] for m in known}:
        out[parent] = {m[-1]: set() for m in known if m[:-1] == parent}
    for me, path in mods.items():
        for r in references(me, path):
            i = 0
            while i < len(me) and i < len(r) and me[i] == r[i]:
                i += 1
            if i >= len(me) or i >= len(r):
                continue  # an ancestor of the file, or itself
            parent = me[:i]
            if r[: i + 1] in known:
                out[parent][me[i]].add(r[i])
    return out


def sccs(graph):
    index, low, stack, on, res, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            res.append(comp)

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    return res


def main():
    bad = False
    for name, src in crates():
        if not os.path.isdir(src):
            continue
        gs = graphs(src)
        found = False
        for parent, graph in sorted(gs.items()):
            for c in sccs(graph):
                if len(c) > 1:
                    found = bad = True
                    where = "::".join(parent) or "the crate root"
                    print(f"{name}: cycle in {where} among {', '.join(sorted(c))}")
        if not found:
            n = sum(len(g) for g in gs.values())
            print(f"{name}: {n} modules, no cycle")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
