#!/usr/bin/env python3
"""How top-down a crate reads: import arrows pointing up, and where the
store types' impl blocks are.

Usage: scripts/layering.py CRATE_SRC_DIR [TYPE ...]
(e.g. scripts/layering.py crates/runkeep-fs/src FsStore FsRootStore)

Counted, per imported name of a top-level `use crate::…` / `use super::…`
(a glob counts once):

- up: the name resolves to an item of a strict ancestor module (the crate
  root, a parent `mod.rs`), not of a module below it;
- cycle: of those, the ones whose ancestor itself uses the subtree the
  importing module is in (`child::…` outside its `mod child;` line), so the
  two import each other;
- parent<->child: the cycles where the ancestor is the direct parent.

Then the lines of lib.rs, and every `impl … TYPE` block whose self type is
one of TYPE, with its file and line. Only the file's own top-level `use`
lines are read (inline test modules are indented and skipped). A small
text scan, not a Rust parser: good for the crates of this repository.
"""

import os
import re
import sys


def modules(src):
    """Module path (tuple) -> file, for every .rs file under src."""
    out = {}
    for dirpath, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, f), src)
            parts = rel[:-3].split(os.sep)
            if parts[-1] in ("lib", "main", "mod"):
                parts = parts[:-1]
            out[tuple(parts)] = os.path.join(dirpath, f)
    return out


def use_statements(text):
    """The top-level `use` statements (column 0), joined onto one line."""
    out, cur = [], None
    for line in text.splitlines():
        if cur is None and re.match(r"(pub(\([a-z]+\))? )?use ", line):
            cur = line
        elif cur is not None:
            cur += " " + line.strip()
        if cur is not None and cur.rstrip().endswith(";"):
            out.append(re.sub(r"^(pub(\([a-z]+\))? )?use ", "", cur).rstrip(";").strip())
            cur = None
    return out


def expand(tree):
    """`a::{b, c::{d, e}}` -> [a::b, a::c::d, a::c::e]."""
    tree = tree.replace(" ", "")
    i = tree.find("{")
    if i < 0:
        return [re.sub(r"as\w+$", "", tree)] if tree else []
    prefix, body = tree[:i], tree[i + 1 : -1]
    parts, depth, start = [], 0, 0
    for j, ch in enumerate(body):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(body[start:j])
            start = j + 1
    parts.append(body[start:])
    return [p for part in parts if part for p in expand(prefix + part)]


def uses_child(text, child):
    """Whether a module's own text uses its child module `child`."""
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("//") or re.match(r"(pub(\([a-z]+\))? )?mod " + child + r"\b", s):
            continue
        if re.search(r"(?<![\w:])" + child + r"::", s):
            return True
    return False


def main():
    src = sys.argv[1]
    types = sys.argv[2:]
    mods = modules(src)
    texts = {m: open(f).read() for m, f in mods.items()}
    up, cycle, pc = [], [], []
    for m, text in sorted(texts.items()):
        for stmt in use_statements(text):
            for path in expand(stmt):
                segs = path.split("::")
                if segs[0] == "crate":
                    cur, rest = (), segs[1:]
                elif segs[0] == "super":
                    cur, rest = m[:-1], segs[1:]
                    while rest and rest[0] == "super":
                        cur, rest = cur[:-1], rest[1:]
                else:
                    continue
                while rest and cur + (rest[0],) in mods:
                    cur, rest = cur + (rest[0],), rest[1:]
                if rest and rest[0] == "self":
                    rest = rest[1:]
                if not rest or len(cur) >= len(m) or m[: len(cur)] != cur:
                    continue
                name = "::".join(cur) or "crate"
                arrow = f"{'/'.join(m)} -> {name}::{rest[0]}"
                up.append(arrow)
                if uses_child(texts[cur], m[len(cur)]):
                    cycle.append(arrow)
                    if len(cur) == len(m) - 1:
                        pc.append(arrow)
    print(f"imports pointing up: {len(up)}")
    print(f"  of which the ancestor uses the importer's subtree (cycles): {len(cycle)}")
    print(f"  of which parent<->child: {len(pc)}")
    for a in up:
        print(f"    {'cycle ' if a in cycle else 'up    '}{a}")
    lib = mods.get(())
    if lib:
        print(f"lib.rs lines: {sum(1 for _ in open(lib))}")
    for t in types:
        blocks = []
        for m, text in sorted(texts.items()):
            for n, line in enumerate(text.splitlines(), 1):
                if re.match(r"\s*impl\b[^{]*\b(crate::)?" + t + r"\b\s*(<[^>]*>)?\s*\{", line) and (
                    " for " not in line or re.search(r" for (crate::)?" + t + r"\b", line)
                ):
                    rel = os.path.relpath(mods[m], src)
                    blocks.append(f"{rel}:{n}: {line.strip().rstrip('{').strip()}")
        print(f"impl blocks of {t}: {len(blocks)}")
        for b in blocks:
            print(f"    {b}")


if __name__ == "__main__":
    main()
