#!/usr/bin/env bash
# Builds the release bundle: host-harness-<version>-<target>.tar.gz holding
# bin/host-harness and bin/libcreateos_provider.so (the harness finds a
# provider next to its binary), SHA256SUMS, INSTALL, the shell completions
# and man page when the harness can generate them, and the Paperclip plugin
# package (paperclip-plugin/, see docs/paperclip.md) when paperclip-worker
# was built.
#
# Usage: bash scripts/bundle.sh [--out DIR] [--from DIR]
#   --out DIR   where to write the archive (default: target/bundle)
#   --from DIR  take host-harness and the provider library from DIR (or its
#               deps/) instead of building them (the tests use the debug build)
set -euo pipefail
cd "$(dirname "$0")/.."
out=target/bundle
from=
while [ $# -gt 0 ]; do
    case "$1" in
        --out) out=$2; shift 2 ;;
        --from) from=$2; shift 2 ;;
        *) echo "bundle.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
if [ -z "$from" ]; then
    cargo build --locked --release -p host-harness -p createos-provider -p paperclip-worker
    from=target/release
fi
library=libcreateos_provider.so
pick() { # the newer of $from/$1 and $from/deps/$1
    { ls -t "$from/$1" "$from/deps/$1" 2>/dev/null || true; } | head -n 1
}
harness=$(pick host-harness)
provider=$(pick "$library")
[ -x "$harness" ] || { echo "bundle.sh: no host-harness in $from" >&2; exit 1; }
[ -f "$provider" ] || { echo "bundle.sh: no $library in $from" >&2; exit 1; }

version=$("$harness" --version | awk '{print $2}')
name="host-harness-$version-$(uname -m)-linux"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/$name/bin"
cp "$harness" "$stage/$name/bin/host-harness"
cp "$provider" "$stage/$name/bin/$library"
if "$harness" completions bash >/dev/null 2>&1; then
    mkdir -p "$stage/$name/share/completions" "$stage/$name/share/man/man1"
    for shell in bash zsh fish; do
        "$harness" completions "$shell" >"$stage/$name/share/completions/host-harness.$shell"
    done
    "$harness" man --out "$stage/$name/share/man/man1"
fi
worker=$(pick paperclip-worker)
paperclip_line=
if [ -x "$worker" ]; then
    "$worker" package --plugin "$provider" --out "$stage/$name/paperclip-plugin" >/dev/null
    paperclip_line=$(printf '  %-34s %s' paperclip-plugin/ "the Paperclip plugin package (paperclipai plugin install)")
fi
contents=$(
    printf '  %-34s %s\n' \
        bin/host-harness "the harness; finds bin/$library beside it" \
        "bin/$library" "the CreateOS provider" \
        share/completions/ "bash, zsh and fish completions" \
        share/man/man1/ "a man page per command (man host-harness)"
    [ -z "$paperclip_line" ] || printf '%s\n' "$paperclip_line"
)
cat >"$stage/$name/INSTALL" <<TEXT
host-harness $version

$contents

Run it from anywhere:
  $name/bin/host-harness lifecycle        # a whole lease lifecycle, offline

Or put the binary on your PATH and install the provider for every host:
  cp bin/host-harness ~/.local/bin/
  host-harness providers install bin/$library
  host-harness providers list

Check the files against SHA256SUMS: (cd $name && sha256sum -c SHA256SUMS)
TEXT
(cd "$stage/$name" && find . -type f ! -name SHA256SUMS -printf '%P\n' | sort | xargs sha256sum >SHA256SUMS)
mkdir -p "$out"
tar -C "$stage" -czf "$out/$name.tar.gz" "$name"
echo "$out/$name.tar.gz"
