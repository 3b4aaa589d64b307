#!/usr/bin/env python3
"""The rules ARCHITECTURE.md states, checked (part of the test command, scripts/test):

1. sizes: no source file over MAX_FILE lines and no function over MAX_FN lines, tests
   (`#[cfg(test)]` modules, `tests/`, `*_tests.rs`), examples and benches aside; a table of
   data is excepted by name in EXCEPT (files) and EXCEPT_FN (functions);
2. links: every relative link of the Markdown docs (`[text](path)`) and every backticked
   repository path in them (`crate/src/file.rs`, `scripts/x.sh`, `docs/x.md`, …) names a path
   that exists;
3. arrows: ARCHITECTURE.md's crate table says what each crate depends on, and its layer
   diagram puts each crate above the ones it names: both agree with the `Cargo.toml`s.

    python3 scripts/house-rules.py        # exit 1 and one line per breach
"""
import os
import re
import sys
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_FILE = 800
MAX_FN = 150
# Files that are tables of data, not logic (path relative to the root: why).
EXCEPT = {
    "replay/src/prompt/words.rs": "a word list",
}
# Functions that are tables of data: one line or statement per column of the trace schema.
EXCEPT_FN = {
    ("trace-format/src/encode.rs", "records_to_batch"): "one builder per column",
    ("trace-format/src/reader/columns.rs", "convert_rows"): "one read per column",
}
SKIP_DIRS = {"target", ".git", "node_modules", "__pycache__"}


def rust_files():
    for dirpath, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS]
        rel = os.path.relpath(dirpath, ROOT)
        parts = rel.split(os.sep)
        if any(p in ("tests", "examples", "benches", "fuzz") for p in parts):
            continue
        for f in files:
            if f.endswith(".rs") and not (f == "tests.rs" or f.endswith("_tests.rs")):
                yield os.path.normpath(os.path.join(rel, f))


def code_of(text):
    """The file up to its inline test module (a `#[cfg(test)] mod x;` elsewhere is skipped)."""
    for m in re.finditer(r"^#\[cfg\(test\)\]\s*\n\s*(pub(\(\w+\))?\s+)?mod\s+\w+\s*[{;]", text, re.M):
        if text[m.end() - 1] == "{":
            return text[: m.start()]
    return text


FN = re.compile(r"^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?(extern\s+\"[^\"]*\"\s+)?fn\s+(\w+)", re.M)


def strip_literals(text):
    """Comments, strings and chars blanked (newlines kept), so braces in them don't count."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:i + 10]) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'r(#*)"', text[i:])
            end = '"' + m.group(1)
            j = text.find(end, i + len(m.group(0)))
            j = n if j < 0 else j + len(end)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[i:i + 4] if text[i + 1:i + 2] != "\\" else text[i:i + 12]):
            m = re.match(r"'(\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'", text[i:])
            if m:
                out.append(" " * len(m.group(0)))
                i += len(m.group(0))
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def long_functions(code):
    """(name, first line, lines) of every function body longer than MAX_FN lines."""
    clean = strip_literals(code)
    for m in FN.finditer(clean):
        start = clean.find("{", m.end())
        semi = clean.find(";", m.end())
        if start < 0 or (0 <= semi < start):
            continue  # a declaration without a body
        depth, i = 0, start
        while i < len(clean):
            if clean[i] == "{":
                depth += 1
            elif clean[i] == "}":
                depth -= 1
                if depth == 0:
                    break
            i += 1
        first = clean.count("\n", 0, m.start()) + 1
        lines = clean.count("\n", start, i) + 1
        if lines > MAX_FN:
            yield m.group(7), first, lines


def check_sizes():
    for rel in rust_files():
        text = open(os.path.join(ROOT, rel), encoding="utf-8").read()
        code = code_of(text)
        n = code.count("\n")
        if n > MAX_FILE and rel not in EXCEPT:
            yield f"{rel}: {n} lines before its tests (at most {MAX_FILE})"
        for name, line, lines in long_functions(code):
            if (rel, name) in EXCEPT_FN:
                continue
            yield f"{rel}:{line}: fn {name} is {lines} lines (at most {MAX_FN})"


DOCS = ["README.md", "ARCHITECTURE.md", "bench/README.md"]
PATH_LIKE = re.compile(r"`((?:[\w.-]+/)+[\w.-]+\.(?:rs|md|py|sh|yaml|yml|json|toml|txt))`")
LINK = re.compile(r"\]\(([^)\s#]+)(#[^)]*)?\)")


def doc_files():
    for d in DOCS:
        if os.path.exists(os.path.join(ROOT, d)):
            yield d
    for base in ("docs", "deploy", "bench/history"):
        for dirpath, dirs, files in os.walk(os.path.join(ROOT, base)):
            for f in files:
                if f.endswith(".md"):
                    yield os.path.relpath(os.path.join(dirpath, f), ROOT)


ALL_FILES = None


def exists(doc, path):
    """`path` from the doc's folder or the root, or (a path written from inside a crate or a
    folder the text names, `tests/same_ids.rs`, `support/http1.rs`) the end of a file's path."""
    global ALL_FILES
    here = os.path.dirname(os.path.join(ROOT, doc))
    if any(os.path.exists(c) for c in (os.path.join(here, path), os.path.join(ROOT, path))):
        return True
    if ALL_FILES is None:
        ALL_FILES = set()
        for dirpath, dirs, files in os.walk(ROOT):
            dirs[:] = [d for d in dirs if d not in SKIP_DIRS]
            for f in files:
                ALL_FILES.add(os.path.relpath(os.path.join(dirpath, f), ROOT))
    return any(f == path or f.endswith("/" + path) for f in ALL_FILES)


def check_links():
    for doc in doc_files():
        text = open(os.path.join(ROOT, doc), encoding="utf-8").read()
        for lineno, line in enumerate(text.splitlines(), 1):
            for m in LINK.finditer(line):
                p = m.group(1)
                if re.match(r"^[a-z]+:", p) or p.startswith("/"):
                    continue
                if not exists(doc, p):
                    yield f"{doc}:{lineno}: link to {p}, which does not exist"
            for m in PATH_LIKE.finditer(line):
                p = m.group(1)
                # ../shared is outside the repository; bench/out/ holds a run's outputs, not
                # committed (the figures quoted from them stay in the text).
                if p.startswith(("../shared/", "/", "~", "bench/out/")) or "*" in p or "<" in p:
                    continue
                if not exists(doc, p):
                    yield f"{doc}:{lineno}: names {p}, which does not exist"


def workspace_deps():
    ws = tomllib.load(open(os.path.join(ROOT, "Cargo.toml"), "rb"))
    members = ws["workspace"]["members"]
    out = {}
    for m in members:
        t = tomllib.load(open(os.path.join(ROOT, m, "Cargo.toml"), "rb"))
        out[m] = {d for d in t.get("dependencies", {}) if d in members}
    return out


def check_arrows():
    deps = workspace_deps()
    text = open(os.path.join(ROOT, "ARCHITECTURE.md"), encoding="utf-8").read()
    table = {}
    for line in text.splitlines():
        m = re.match(r"^\| `([\w-]+)/` \|.*\| ([^|]*) \|$", line)
        if m and m.group(1) in deps:
            said = m.group(2)
            table[m.group(1)] = {d for d in re.findall(r"[\w-]+", said) if d in deps}
    for c, want in sorted(deps.items()):
        if c not in table:
            yield f"ARCHITECTURE.md: no row for the crate {c}"
        elif table[c] != want:
            yield (f"ARCHITECTURE.md: {c} depends on {', '.join(sorted(want)) or 'nothing'} "
                   f"(Cargo.toml), the table says {', '.join(sorted(table[c])) or 'nothing'}")
    layer = {}
    for line in text.splitlines():
        m = re.match(r"^layer (\d+)\s+(.*)$", line)
        if m:
            for c in m.group(2).split():
                layer[c] = int(m.group(1))
    for c, ds in sorted(deps.items()):
        if c not in layer:
            yield f"ARCHITECTURE.md: the layer diagram has no {c}"
            continue
        for d in sorted(ds):
            if d in layer and layer[d] > layer[c]:
                yield f"ARCHITECTURE.md: {c} (layer {layer[c]}) depends on {d} (layer {layer[d]}), above it"
            if d in layer and layer[d] == layer[c]:
                said = re.search(rf"`{re.escape(c)}` names `{re.escape(d)}`", text)
                if not said:
                    yield f"ARCHITECTURE.md: {c} depends on {d} in its own layer {layer[c]} and the text does not say so"


def main():
    bad = [*check_sizes(), *check_links(), *check_arrows()]
    for b in bad:
        print(b)
    if not bad:
        print("house rules: sizes, links and arrows hold")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
