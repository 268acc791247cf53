#!/usr/bin/env python3
"""Checks that the declared `rust-version` of each published package holds for its locked
dependencies.

Runs `cargo metadata` (or reads its JSON from `--metadata FILE`) and walks each published workspace package's
normal and build dependencies (dev-dependencies are not built by users of the package). The
highest `rust-version` among them is what the package really needs; a declared value below it
fails. A declared value above it is reported, not failed: the package's own code may need more
(clippy's `incompatible_msrv` lint, run by CI, checks the standard-library APIs it calls against
the declared value). Dependencies that declare no `rust-version` are listed.

Usage: python3 .ci/msrv.py [--target TRIPLE] [--metadata FILE]
"""
import json
import subprocess
import sys


def version(text):
    """`1.88` or `1.88.0` as a comparable tuple (major, minor, patch)."""
    parts = [int(p) for p in text.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))


def show(v):
    return f"{v[0]}.{v[1]}" if v[2] == 0 else ".".join(map(str, v))


def metadata(target, path):
    if path:
        with open(path) as f:
            return json.load(f)
    cmd = ["cargo", "metadata", "--format-version", "1", "--locked"]
    if target:
        cmd += ["--filter-platform", target]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def main():
    args = sys.argv[1:]
    target = args[args.index("--target") + 1] if "--target" in args else None
    path = args[args.index("--metadata") + 1] if "--metadata" in args else None
    meta = metadata(target, path)
    packages = {p["id"]: p for p in meta["packages"]}
    nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
    members = set(meta["workspace_members"])
    # `publish = false` reads as an empty list of registries.
    published = [i for i in members if packages[i].get("publish") != []]
    failed = False
    for root in sorted(published, key=lambda i: packages[i]["name"]):
        pkg = packages[root]
        declared = pkg.get("rust_version")
        if not declared:
            print(f"{pkg['name']}: no rust-version declared")
            failed = True
            continue
        declared = version(declared)
        seen, stack = set(), [root]
        while stack:
            node = stack.pop()
            if node in seen:
                continue
            seen.add(node)
            for dep in nodes[node]["deps"]:
                if any(k["kind"] != "dev" for k in dep["dep_kinds"]):
                    stack.append(dep["pkg"])
        seen.discard(root)
        needs, unknown = [], []
        for i in seen:
            p = packages[i]
            if p.get("rust_version"):
                needs.append((version(p["rust_version"]), f"{p['name']} {p['version']}"))
            else:
                unknown.append(f"{p['name']} {p['version']}")
        needs.sort(reverse=True)
        required = needs[0][0] if needs else (1, 0, 0)
        top = ", ".join(who for v, who in needs if v == required)
        line = (f"{pkg['name']}: rust-version {show(declared)}; its {len(seen)} locked normal/build "
                f"dependencies need {show(required)} ({top})")
        if unknown:
            line += f"; declaring none: {', '.join(sorted(unknown))}"
        print(line)
        if declared < required:
            print(f"  FAIL: a dependency needs Rust {show(required)} but {pkg['name']} declares "
                  f"{show(declared)}; raise rust-version (and the README's MSRV line) or pin the "
                  f"dependency lower")
            failed = True
        elif declared > required:
            print(f"  note: declared above what the dependencies need; keep it only if the "
                  f"package's own code needs Rust {show(declared)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
