#!/usr/bin/env bash
# Non-test Rust code lines of the crates that ship, at a commit: cloc's
# "code" column (no blanks, no comments) over each crate's `src/`, after
# removing every top-level `#[cfg(test)] mod … { … }` block and every file a
# `#[cfg(test)] mod name;` declares. The method of docs/benchmarks.md
# ("Code size").
#
#   bash scripts/code-lines.sh [REV]     # default HEAD
#
# Needs cloc (Debian package `cloc`) and python3.
set -euo pipefail
rev=${1:-HEAD}
command -v cloc >/dev/null || { echo "code-lines: cloc is not installed (apt-get install cloc)" >&2; exit 2; }
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
git archive "$rev" | tar -x -C "$tree"
crates="provider-abi createos-provider provider-host provider-conform host-harness examples/hello-provider paperclip-worker"
python3 - "$tree" $crates <<'PY'
import os, re, sys
tree, crates = sys.argv[1], sys.argv[2:]
test_attr = re.compile(r"^#\[cfg\(test\)\]\s*$")
module = re.compile(r"^(pub(\([^)]*\))? )?mod (\w+)\s*(;|\{)")
for crate in crates:
    for folder, _, files in os.walk(os.path.join(tree, crate, "src")):
        for name in files:
            if not name.endswith(".rs"):
                continue
            path = os.path.join(folder, name)
            if not os.path.exists(path):
                continue
            lines, kept, i = open(path, encoding="utf-8").read().split("\n"), [], 0
            while i < len(lines):
                if test_attr.match(lines[i]):
                    j = i + 1
                    while j < len(lines) and lines[j].startswith("#["):
                        j += 1
                    found = module.match(lines[j]) if j < len(lines) else None
                    if found and found.group(4) == ";":
                        stem = os.path.splitext(name)[0]
                        home = folder if stem in ("mod", "lib", "main") else os.path.join(folder, stem)
                        for candidate in (os.path.join(home, found.group(3) + ".rs"),
                                          os.path.join(home, found.group(3), "mod.rs")):
                            if os.path.exists(candidate):
                                os.remove(candidate)
                        i = j + 1
                        continue
                    if found:
                        k = j + 1
                        while k < len(lines) and lines[k] != "}":
                            k += 1
                        i = k + 1
                        continue
                kept.append(lines[i])
                i += 1
            open(path, "w", encoding="utf-8").write("\n".join(kept))
PY
# The total without paperclip-worker compares with commits from before it
# existed (the five crates of ABI 1.x, provider-conform being split from
# host-harness since).
total=0
printf '%-26s %8s\n' crate "code"
for crate in $crates; do
    [ -d "$tree/$crate/src" ] || continue
    lines=$(cloc --timeout 0 --include-lang=Rust --quiet --csv "$tree/$crate/src" | awk -F, '$2 == "Rust" { print $5 }')
    printf '%-26s %8d\n' "$crate" "${lines:-0}"
    [ "$crate" = paperclip-worker ] && worker=${lines:-0}
    total=$((total + ${lines:-0}))
done
printf '%-26s %8d\n' "total" "$total" "without paperclip-worker" "$((total - ${worker:-0}))"
