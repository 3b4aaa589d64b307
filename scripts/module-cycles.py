#!/usr/bin/env python3
"""Report import cycles between the modules of each crate in the workspace.

A module's dependencies are the sibling modules it names as `crate::m`, `super::m`
(from a top-level module) or, in the binary, `crate::m`. Test modules (`#[cfg(test)]`
to the end of a file) are ignored: tests may reach anywhere. Exit 1 if any crate has
a cycle; print each strongly connected component of more than one module.

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


def modules(src):
    mods = {}
    for dirpath, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, src)
            parts = rel[:-3].split(os.sep)
            if parts[-1] == "mod":
                parts = parts[:-1]
            if parts in (["lib"], ["main"]) or not parts:
                continue
            mods.setdefault(parts[0], []).append(path)
    return mods


def strip_tests(text):
    m = re.search(r"^#\[cfg\(test\)\]\s*\n\s*mod\s+\w+\s*\{", text, re.M)
    return text[: m.start()] if m else text


def deps(paths, names, me):
    out = set()
    for p in paths:
        text = strip_tests(open(p).read())
        text = re.sub(r"//[^\n]*", "", text)
        for m in re.finditer(r"\bcrate::(\w+)", text):
            out.add(m.group(1))
        # `use crate::{a, b::c}` groups
        for g in re.finditer(r"\bcrate::\{([^}]*)\}", text):
            for n in re.findall(r"(?:^|[,{\s])(\w+)", g.group(1)):
                out.add(n)
        if os.path.dirname(p) == os.path.dirname(paths[0]) and not p.endswith("mod.rs"):
            pass
    return {d for d in out if d in names and d != me}


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
        mods = modules(src)
        graph = {m: deps(p, set(mods), m) for m, p in mods.items()}
        cyc = [sorted(c) for c in sccs(graph) if len(c) > 1]
        if cyc:
            bad = True
            for c in cyc:
                print(f"{name}: cycle among {', '.join(c)}")
        else:
            print(f"{name}: {len(mods)} modules, no cycle")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
