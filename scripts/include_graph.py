#!/usr/bin/env python3
"""Draws the house from its includes: for a folder of sources, its rooms (the folder's direct
entries: a subfolder, or the files of one stem, foo.h and foo.cc together), the arrows between
them (room A includes a header of room B), the floors they stand on and the arrows that run back
up. A public header (chorus/foo.h under an include directory) belongs to the room that holds
foo.cc, wherever that is under the folder.

Floors: a room that includes no other room of the folder is on floor 1; any other room stands one
floor above the highest room it includes. Where includes form a cycle, the arrows that close it
(a depth-first search's back edges, rooms visited by name) are the back-arrows and are left out of
the floors. A house with no back-arrow can be read from the ground up.

  scripts/include_graph.py torch/src [--include torch/include] [--recursive] [--arrows] [--dot F]

--recursive draws every subfolder too (its rooms are its own entries); --arrows lists each arrow,
back-arrows marked; --dot writes the top folder's graph for Graphviz.
"""
import argparse
import os
import re
import sys
from collections import defaultdict

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
SOURCE = (".h", ".cc", ".c", ".cpp", ".hpp")


def sources(folder):
    for dirpath, _, files in os.walk(folder):
        for f in sorted(files):
            if f.endswith(SOURCE):
                yield os.path.join(dirpath, f)


def stem_index(folder):
    """stem -> the file path of its .cc (or .h) under folder, to place public headers."""
    index = {}
    for path in sources(folder):
        stem = os.path.splitext(os.path.basename(path))[0]
        if path.endswith((".cc", ".c", ".cpp")) or stem not in index:
            index[stem] = path
    return index


def room_of(folder, path):
    rel = os.path.relpath(path, folder)
    first = rel.split(os.sep)[0]
    return first if os.sep in rel else os.path.splitext(first)[0]


def resolve(include, including_file, folder, top, roots, stems):
    """The file under folder that `include` names, or None when it lies outside."""
    for base in [os.path.dirname(including_file), top, *roots]:
        candidate = os.path.normpath(os.path.join(base, include))
        if os.path.isfile(candidate):
            if candidate.startswith(folder + os.sep):
                return candidate
            if candidate.startswith(top + os.sep):
                return None
            # A public header: it belongs to the room holding the sources of its stem.
            stem = os.path.splitext(os.path.basename(candidate))[0]
            if any(os.path.abspath(candidate).startswith(os.path.abspath(r) + os.sep) for r in roots):
                return stems.get(stem)
            return None
    return None


def arrows_of(folder, top, roots):
    folder, top = os.path.abspath(folder), os.path.abspath(top)
    stems = stem_index(folder)
    arrows = defaultdict(set)  # (from, to) -> the include lines behind it
    rooms = set()
    for path in sources(folder):
        src = room_of(folder, path)
        rooms.add(src)
        with open(path, encoding="utf-8", errors="replace") as f:
            for inc in INCLUDE.findall(f.read()):
                target = resolve(inc, path, folder, top, roots, stems)
                if target is None:
                    continue
                dst = room_of(folder, target)
                if dst != src:
                    arrows[(src, dst)].add(f"{os.path.relpath(path, folder)} -> {inc}")
    return sorted(rooms), arrows


def floors_of(rooms, arrows):
    out = defaultdict(list)
    for a, b in sorted(arrows):
        out[a].append(b)
    back, state = set(), {}

    def visit(r):  # iterative enough for a folder's few dozen rooms
        state[r] = "open"
        for n in out[r]:
            if state.get(n) == "open":
                back.add((r, n))
            elif n not in state:
                visit(n)
        state[r] = "done"

    for r in rooms:
        if r not in state:
            visit(r)
    floor = {}

    def height(r):
        if r not in floor:
            floor[r] = 1 + max((height(n) for n in out[r] if (r, n) not in back), default=0)
        return floor[r]

    for r in rooms:
        height(r)
    return floor, back


def report(folder, top, roots, show_arrows, dot=None):
    rooms, arrows = arrows_of(folder, top, roots)
    floor, back = floors_of(rooms, arrows)
    pairs = sorted({tuple(sorted(a)) for a in arrows if (a[1], a[0]) in arrows})
    nfloors = max(floor.values(), default=0)
    print(f"{folder}: {len(rooms)} rooms, {nfloors} floors, {len(arrows)} arrows, {len(back)} back-arrows, "
          f"{len(pairs)} back-and-forth pairs")
    for f in range(nfloors, 0, -1):
        print(f"  floor {f}: {' '.join(r for r in rooms if floor[r] == f)}")
    if back:
        for a, b in sorted(back):
            print(f"  back: {a} -> {b}   ({'; '.join(sorted(arrows[(a, b)]))})")
    if show_arrows:
        for (a, b), why in sorted(arrows.items()):
            print(f"  {'BACK ' if (a, b) in back else ''}{a} -> {b}: {'; '.join(sorted(why))}")
    if dot:
        with open(dot, "w") as f:
            f.write("digraph house {\n  rankdir=BT;\n  node [shape=box];\n")
            for (a, b) in sorted(arrows):
                style = ' [color=red]' if (a, b) in back else ''
                f.write(f'  "{a}" -> "{b}"{style};\n')
            f.write("}\n")
    return len(back)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder")
    ap.add_argument("--include", action="append", default=[], help="a public include directory (repeatable)")
    ap.add_argument("--recursive", action="store_true")
    ap.add_argument("--arrows", action="store_true")
    ap.add_argument("--dot")
    args = ap.parse_args()
    roots = [os.path.abspath(r) for r in args.include]
    total = report(args.folder, args.folder, roots, args.arrows, args.dot)
    if args.recursive:
        for dirpath, dirs, _ in os.walk(args.folder):
            for d in sorted(dirs):
                total += report(os.path.join(dirpath, d), args.folder, roots, args.arrows)
    sys.exit(1 if total else 0)


if __name__ == "__main__":
    main()
