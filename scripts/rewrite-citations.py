#!/usr/bin/env python3
"""Rewrites the code's specification citations by the table in CITATIONS.tsv.

    scripts/rewrite-citations.py [--check] [TABLE]      (default TABLE: CITATIONS.tsv)

Each line of the table is `old text<TAB>new text` (`\\n` in a field is a line break; lines
starting with `#` are comments). Every .rs file under src, shards, bench-harness, crash and
tests (skipping target directories) has each old text replaced by its new text, literally,
longest old text first, so a long form is rewritten before a shorter one inside it. With
--check nothing is written. Prints how often each line applied; exits 1 when a line never
applied (the table and the tree disagree), else 0. Run it once, then `cargo test --release
--test docs` checks that every citation names a numbered section of docs/.
"""
import os
import sys

ROOTS = ["src", "shards", "bench-harness", "crash", "tests"]


def load(table):
    pairs = []
    with open(table, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            if line.count("\t") != 1:
                sys.exit(f"{table}:{n}: expected `old<TAB>new`")
            old, new = (p.replace("\\n", "\n") for p in line.split("\t"))
            pairs.append((old, new))
    pairs.sort(key=lambda p: -len(p[0]))
    return pairs


def sources(repo):
    for root in ROOTS:
        for d, dirs, files in os.walk(os.path.join(repo, root)):
            dirs[:] = sorted(x for x in dirs if x != "target")
            for f in sorted(files):
                if f.endswith(".rs"):
                    yield os.path.join(d, f)


def main():
    args = [a for a in sys.argv[1:] if a != "--check"]
    check = "--check" in sys.argv[1:]
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    table = args[0] if args else os.path.join(repo, "CITATIONS.tsv")
    pairs = load(table)
    used = [0] * len(pairs)
    changed = 0
    for path in sources(repo):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        out = text
        for i, (old, new) in enumerate(pairs):
            n = out.count(old)
            if n:
                used[i] += n
                out = out.replace(old, new)
        if out != text:
            changed += 1
            if not check:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(out)
    unused = [pairs[i][0] for i, n in enumerate(used) if n == 0]
    print(f"{sum(used)} citations in {changed} files{' (checked only)' if check else ''}")
    for old in unused:
        print(f"never applied: {old!r}", file=sys.stderr)
    return 1 if unused else 0


if __name__ == "__main__":
    sys.exit(main())
