#!/usr/bin/env python3
"""Prints the import cycles between the modules of Rust crates.

Usage: scripts/module-cycles.py CRATE_DIR...

The graph of each crate's `src/` (its library and its binary, each from its
root file and the `mod x;` declarations below it) has one node per module
(a file, or an inline `mod x { … }`) and an edge A -> B where A names a path
into B:

- `use crate::…` and `use super::…` (groups `{…}` included), and
- `crate::x::…` and `super::x::…` paths anywhere in the code.

A path resolves to the longest module that is a prefix of it
(`super::model::Fault` in `engine/accept.rs` is `engine::model`;
`super::Engine` is `engine`). Comments and literals are ignored. An inline
module resolves `super` from where it is and is a node of its own, so a
`mod tests` that reaches into a sibling of its file makes no cycle. A plain
`child::x` path from a parent is not an edge.

For each set of modules that reach each other, prints one cycle through
them with the lines that make its edges. Exits 1 when any crate has a
cycle, 2 on a usage error.
"""

import os
import sys

ROOTS = (("lib", "lib.rs"), ("bin", "main.rs"))


def strip(text):
    """The text with comments, strings and char literals blanked (newlines kept)."""
    out = []
    i, n = 0, len(text)

    def blank(s):
        out.append("".join(c if c == "\n" else " " for c in s))

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            blank(text[i:j])
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            blank(text[i:j])
            i = j
        elif c in "rb" and _raw_string_at(text, i):
            j = _raw_string_end(text, i)
            blank(text[i:j])
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            blank(text[i : j + 1])
            i = j + 1
        elif c == "'":
            # A char literal ('a', '\n', '\u{1F}'); otherwise a lifetime.
            if text.startswith("\\", i + 1):
                j = text.find("'", i + 2)
            elif i + 2 < n and text[i + 2] == "'":
                j = i + 2
            else:
                j = -1
            if j < 0:
                out.append(c)
                i += 1
            else:
                blank(text[i : j + 1])
                i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _raw_string_at(text, i):
    j = i + 1 if text[i] == "r" else i + 2 if text.startswith("br", i) else -1
    if j < 0 or (i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_")):
        return False
    while j < len(text) and text[j] == "#":
        j += 1
    return j < len(text) and text[j] == '"' and (j > i + 1 or text[i] == "r")


def _raw_string_end(text, i):
    j = i + (1 if text[i] == "r" else 2)
    hashes = 0
    while text[j] == "#":
        hashes, j = hashes + 1, j + 1
    end = text.find('"' + "#" * hashes, j + 1)
    return len(text) if end < 0 else end + 1 + hashes


def tokens(text):
    """(token, line) pairs: identifiers, `::` and single punctuation."""
    out = []
    i, n, line = 0, len(text), 1
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif c.isspace():
            i += 1
        elif c.isalpha() or c == "_":
            j = i
            while j < n and (text[j].isalnum() or text[j] == "_"):
                j += 1
            word = text[i:j]
            if word == "r" and text.startswith("#", j):
                # A raw identifier: r#name.
                k = j + 1
                while k < n and (text[k].isalnum() or text[k] == "_"):
                    k += 1
                word, j = text[j + 1 : k], k
            out.append((word, line))
            i = j
        elif text.startswith("::", i):
            out.append(("::", line))
            i += 2
        else:
            out.append((c, line))
            i += 1
    return out


def is_ident(t):
    return t[0].isalpha() or t[0] == "_"


def parse_use_tree(toks, i, prefix, leaves):
    """Parses one use tree at toks[i]; appends (segments, line) leaves.
    Returns the index after the tree."""
    segs = list(prefix)
    line = toks[i][1] if i < len(toks) else 0
    while i < len(toks):
        t = toks[i][0]
        if t == "::":
            i += 1
        elif t == "{":
            i += 1
            while i < len(toks) and toks[i][0] != "}":
                if toks[i][0] == ",":
                    i += 1
                    continue
                i = parse_use_tree(toks, i, segs, leaves)
            return i + 1
        elif t == "*":
            leaves.append((segs, line))
            return i + 1
        elif is_ident(t) and t != "as":
            segs.append(t)
            line = toks[i][1]
            i += 1
        else:
            if t == "as":
                i += 2
            leaves.append((segs, line))
            return i
    leaves.append((segs, line))
    return i


def crate_files(src, root_file):
    """{module path tuple: file} for one crate, from its root file."""
    files = {}
    todo = [((), os.path.join(src, root_file))]
    while todo:
        mod, path = todo.pop()
        if mod in files or not os.path.isfile(path):
            continue
        files[mod] = path
        base = os.path.basename(path)
        if base in ("lib.rs", "main.rs", "mod.rs"):
            child_dir = os.path.dirname(path)
        else:
            child_dir = os.path.join(os.path.dirname(path), base[:-3])
        with open(path, encoding="utf-8") as f:
            toks = tokens(strip(f.read()))
        depth_inline = 0
        for k, (t, _) in enumerate(toks):
            if t != "mod" or k + 2 >= len(toks) or not is_ident(toks[k + 1][0]):
                continue
            if k > 0 and toks[k - 1][0] == "::":
                continue
            name, after = toks[k + 1][0], toks[k + 2][0]
            if after == ";" and depth_inline == 0:
                for cand in (
                    os.path.join(child_dir, name + ".rs"),
                    os.path.join(child_dir, name, "mod.rs"),
                ):
                    if os.path.isfile(cand):
                        todo.append((mod + (name,), cand))
                        break
    return files


def references(mod, path):
    """The inline modules a module file declares, and the `crate::`/`super::`
    paths it names: ([module path], [(from module, absolute segments, line)])."""
    with open(path, encoding="utf-8") as f:
        toks = tokens(strip(f.read()))
    inline, refs = [], []
    scope = []  # inline modules: (name, brace depth at their opening)
    depth = 0
    i = 0

    def absolute(segs, line):
        here = list(mod) + [s for s, _ in scope]
        source = tuple(here)
        if not segs or segs[0] not in ("crate", "super"):
            return
        k = 0
        if segs[0] == "crate":
            here, k = [], 1
        while k < len(segs) and segs[k] == "super":
            if not here:
                return
            here.pop()
            k += 1
        refs.append((source, tuple(here + segs[k:]), line))

    while i < len(toks):
        t, line = toks[i]
        prev = toks[i - 1][0] if i else ""
        if t == "{":
            depth += 1
        elif t == "}":
            depth -= 1
            if scope and scope[-1][1] == depth:
                scope.pop()
        elif (
            t == "mod"
            and i + 2 < len(toks)
            and is_ident(toks[i + 1][0])
            and toks[i + 2][0] == "{"
        ):
            scope.append((toks[i + 1][0], depth))
            inline.append(tuple(mod) + tuple(s for s, _ in scope))
            depth += 1
            i += 3
            continue
        elif t == "use" and prev != "::":
            leaves = []
            j = i + 1
            if j < len(toks) and toks[j][0] == "::":
                j += 1
            end = parse_use_tree(toks, j, [], leaves)
            for segs, ln in leaves:
                absolute(segs, ln)
            i = end
            continue
        elif t in ("crate", "super") and prev != "::":
            segs = [t]
            j = i + 1
            while (
                j + 1 < len(toks)
                and toks[j][0] == "::"
                and is_ident(toks[j + 1][0])
            ):
                segs.append(toks[j + 1][0])
                j += 2
            if len(segs) > 1:
                absolute(segs, line)
            i = j
            continue
        i += 1
    return inline, refs


def resolve(full, modules):
    """The longest module that is a prefix of an absolute path."""
    for cut in range(len(full), -1, -1):
        if full[:cut] in modules:
            return full[:cut]
    return ()


def cycles(nodes, graph):
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, on, stack, comps = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
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
                comps.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return comps


def one_cycle(comp, graph):
    """A shortest cycle through the first node of a component."""
    members = set(comp)
    start = comp[0]
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph.get(v, ())):
            if w not in members:
                continue
            if w == start:
                return paths[v] + [start]
            if w not in paths:
                paths[w] = paths[v] + [w]
                queue.append(w)
    return [start]


def name(mod):
    return "::".join(mod) if mod else "crate"


def check_crate(crate_dir):
    src = os.path.join(crate_dir, "src")
    if not os.path.isdir(src):
        src = crate_dir
    label = os.path.normpath(crate_dir)
    found_any = False
    present = [(kind, f) for kind, f in ROOTS if os.path.isfile(os.path.join(src, f))]
    if not present:
        print(f"{label}: no lib.rs or main.rs under {src}", file=sys.stderr)
        sys.exit(2)
    for kind, root in present:
        files = crate_files(src, root)
        modules, refs = dict(files), []
        for mod, path in files.items():
            inline, found = references(mod, path)
            modules.update((m, path) for m in inline)
            refs.extend((path, r) for r in found)
        graph, where = {}, {}
        for path, (source, full, line) in refs:
            target = resolve(full, modules)
            if target == source:
                continue
            graph.setdefault(source, set()).add(target)
            rel = os.path.relpath(path, os.path.dirname(os.path.normpath(src)))
            where.setdefault((source, target), (rel, []))[1].append(line)
        crate = f"{label} ({kind})" if len(present) > 1 else label
        comps = cycles(modules.keys(), graph)
        n_edges = sum(len(v) for v in graph.values())
        if not comps:
            print(f"{crate}: no module cycles ({len(modules)} modules, {n_edges} edges)")
            continue
        found_any = True
        for comp in comps:
            print(f"{crate}: cycle among {', '.join(name(m) for m in comp)}")
            path = one_cycle(comp, graph)
            for a, b in zip(path, path[1:]):
                rel, lines = where[(a, b)]
                shown = ", ".join(str(x) for x in sorted(set(lines))[:5])
                print(f"    {name(a)} -> {name(b)}  ({rel}:{shown})")
    return found_any


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    bad = False
    for crate_dir in argv[1:]:
        bad |= check_crate(crate_dir)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
