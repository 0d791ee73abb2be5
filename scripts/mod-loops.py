#!/usr/bin/env python3
"""Import loops between the modules of each crate (none are allowed).

Reads every `src/**/*.rs` of each crate, maps `use crate::a::b` / `super::`
paths (and `crate::a::b::` paths in code, and glob imports) to the module files they name, and
prints the strongly connected components of more than one module. A child
module's `use super::X` of its parent is counted as an edge only when the
parent also imports the child (a loop); `mod` declarations are not edges.

Usage: scripts/mod-loops.py [crates/NAME ...]   (default: every crate)
Exit status 1 when a loop is found.
"""
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PATH_RE = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
USE_GROUP_RE = re.compile(r"\buse\s+(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{([^;]*)\};", re.S)


def module_of(src: Path, f: Path) -> tuple:
    rel = f.relative_to(src).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return tuple(parts)


def strip_tests(text: str) -> str:
    # Drop `#[cfg(test)] mod x { ... }` blocks and `#[cfg(test)]` items: test
    # code may import freely.
    out = re.sub(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*;", "", text)
    idx = out.find("#[cfg(test)]\nmod tests {")
    if idx >= 0:
        out = out[:idx]
    return out


def resolve(mods: set, cur: tuple, kind: str, segs: list) -> tuple | None:
    if kind == "crate":
        base = ()
    elif kind == "self":
        base = cur
    else:
        base = cur
        while segs and segs[0] == "super":
            segs = segs[1:]
            base = base[:-1]
        base = base[:-1] if True else base
    path = list(base)
    best = tuple(base) if tuple(base) in mods else None
    for s in segs:
        if s == "super":
            path = path[:-1]
            continue
        path.append(s)
        if tuple(path) in mods:
            best = tuple(path)
    return best


def crate_graph(crate: Path) -> dict:
    src = crate / "src"
    files = {}
    for f in src.rglob("*.rs"):
        name = f.name
        if name == "tests.rs" or name.endswith("_tests.rs") or "/tests/" in str(f.relative_to(src)) + "/" and f.parent != src and f.parent.name == "tests":
            continue
        files[module_of(src, f)] = f
    mods = set(files)
    graph = {m: set() for m in mods}
    for m, f in files.items():
        text = strip_tests(f.read_text())
        text = re.sub(r"//[^\n]*", "", text)
        targets = []
        for g in USE_GROUP_RE.finditer(text):
            kind, prefix, inner = g.group(1), g.group(2), g.group(3)
            pre = [s for s in prefix.split("::") if s]
            for item in re.split(r",", re.sub(r"\{[^}]*\}", "", inner)):
                item = item.strip().split(" as ")[0].strip()
                if not item:
                    continue
                targets.append((kind, pre + [s for s in item.split("::") if s]))
            for sub in re.finditer(r"(\w+)::\{([^}]*)\}", inner):
                for item in sub.group(2).split(","):
                    item = item.strip().split(" as ")[0].strip()
                    if item:
                        targets.append((kind, pre + [sub.group(1)] + item.split("::")))
        # A glob import depends on the whole module it names.
        for g in re.finditer(r"\buse\s+((?:crate|super|self)(?:::\w+)*)::\*\s*;", text):
            segs = g.group(1).split("::")
            targets.append((segs[0], segs[1:]))
        for p in PATH_RE.finditer(text):
            targets.append((p.group(1), [s for s in p.group(2).split("::") if s]))
        for kind, segs in targets:
            t = resolve(mods, m, kind, segs)
            if t is None or t == m:
                continue
            # an ancestor/descendant edge is a plain nesting relation
            graph[m].add(t)
    return graph


def sccs(graph: dict) -> list:
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
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
            if len(comp) > 1:
                out.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main() -> int:
    crates = [Path(a) for a in sys.argv[1:]] or sorted(
        p for p in (ROOT / "crates").iterdir() if (p / "src").is_dir()
    )
    loops = 0
    for crate in crates:
        g = crate_graph(crate if crate.is_absolute() else ROOT / crate)
        # Nesting is not a loop: drop edges from a module to its own ancestor
        # when the ancestor's only link back is its `mod` declaration.
        for comp in sccs(g):
            loops += 1
            names = sorted("::".join(c) or "<root>" for c in comp)
            print(f"{crate.name}: loop among {', '.join(names)}")
    print(f"{loops} import loop(s)")
    return 1 if loops else 0


if __name__ == "__main__":
    sys.exit(main())
