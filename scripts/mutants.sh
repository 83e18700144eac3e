#!/usr/bin/env bash
# Mutation testing of createos-provider, provider-abi and the host's loader
# (provider-host/src/loader) with cargo-mutants,
# then the score of each source file.
#
#   bash scripts/mutants.sh                  # every file listed below
#   bash scripts/mutants.sh createos-provider/src/script.rs ...
#
# Slow (each mutant is a build and a test run), so not in CI: run it before
# finishing a change to these crates, and put the scores in
# docs/benchmarks.md ("Mutation scores"). Mutants that cannot change
# behaviour are excluded, each with its reason, in .cargo/mutants.toml.
#
# Environment:
#   MUTANTS_IN_PLACE=1   mutate the working tree itself and reuse its warm
#                        target/ (much faster; do not edit files meanwhile).
#                        Default: a scratch copy of the tree and of target/.
#   MUTANTS_TIMEOUT=S    test timeout per mutant in seconds (default 300).
#   MUTANTS_OUT=DIR      where the reports go (default target/mutants).
#   MUTANTS_RE=REGEX     only the mutants whose name matches (e.g. a rerun of
#                        the ones a previous run missed).
#   MUTANTS_EXCLUDE_RE=REGEX  skip the mutants whose name matches (e.g. the
#                        return-value replacements that never compile).
#
# Files tested through the loaded library run, for each mutant, only the
# tests that exercise them (`e2e_tests` below, a cargo-nextest filter), and
# stop at the first failure: a caught mutant costs seconds, not the whole
# suite. They need cargo-nextest (installed like cargo-mutants when missing).
set -euo pipefail
cd "$(dirname "$0")/.."

command -v cargo-mutants >/dev/null || cargo install cargo-mutants --locked
command -v cargo-nextest >/dev/null || cargo install cargo-nextest --locked

# Modules with unit tests: their crate's own tests judge them.
own_tests=(
    createos-provider/src/script.rs
    createos-provider/src/config.rs
    createos-provider/src/ndjson.rs
    createos-provider/src/registry.rs
    createos-provider/src/pacer.rs
    createos-provider/src/handoff.rs
)
# Modules exercised through the loaded library: the end-to-end tests too.
with_e2e=(
    createos-provider/src/lease.rs
    provider-abi/src/*.rs
    provider-host/src/loader/*.rs
)

# The packages whose tests judge a file of `with_e2e`, and which of their
# tests (a cargo-nextest filter expression).
e2e_packages() {
    case $1 in
    provider-host/src/loader/elf.rs) echo provider-host ;;
    provider-abi/*) echo provider-abi e2e ;;
    provider-host/src/loader/*) echo provider-host e2e ;;
    *) echo e2e ;;
    esac
}
e2e_tests() {
    case $1 in
    createos-provider/src/lease.rs)
        echo 'binary_id(e2e::e2e) & test(/^(lease|lease_outcomes|binding|commands)::/)' ;;
    # Its unit tests forge headers of every kind; loading real files adds nothing.
    provider-host/src/loader/elf.rs)
        echo 'package(provider-host) & kind(lib) & test(/^loader::/)' ;;
    # The crate's tests but the compile-fail ones (they test the types, not
    # the code), and the ABI contract through the fixture libraries.
    provider-abi/*)
        echo '(package(provider-abi) & !binary(compile_fail)) | (binary_id(e2e::e2e) & test(/^(abi|loading)::/))' ;;
    # The loader's unit tests, and loading the fixture libraries end to end.
    provider-host/src/loader/*)
        echo '(package(provider-host) & kind(lib) & test(/^loader::/)) | (binary_id(e2e::e2e) & test(/^(abi|loading)::/))' ;;
    *) echo 'all()' ;;
    esac
}

if (($#)); then files=("$@"); else files=("${own_tests[@]}" "${with_e2e[@]}"); fi

timeout_s=${MUTANTS_TIMEOUT:-300}
out_root=${MUTANTS_OUT:-target/mutants}
common=(--baseline=skip --timeout "$timeout_s" --copy-target=true)
[[ ${MUTANTS_IN_PLACE:-0} == 1 ]] && common=(--baseline=skip --timeout "$timeout_s" --in-place)
[[ -n ${MUTANTS_RE:-} ]] && common+=(--re "$MUTANTS_RE")
[[ -n ${MUTANTS_EXCLUDE_RE:-} ]] && common+=(--exclude-re "$MUTANTS_EXCLUDE_RE")

needs_e2e() {
    local file=$1 pattern
    for pattern in "${with_e2e[@]}"; do
        # shellcheck disable=SC2053 # the list holds globs
        [[ $file == $pattern ]] && return 0
    done
    return 1
}

unit_files=() e2e_files=()
for file in "${files[@]}"; do
    if needs_e2e "$file"; then
        e2e_files+=("$file")
    else
        unit_files+=(--file "$file")
    fi
done

# proptest records the failures a mutant causes; in place, those records
# would land in the tree: remove the ones this run creates.
preexisting=$(find . -path ./target -prune -o -type d -name proptest-regressions -print)
cleanup() {
    find . -path ./target -prune -o -type d -name proptest-regressions -print | while read -r dir; do
        grep -qxF "$dir" <<<"$preexisting" || rm -rf "$dir"
    done
}
trap cleanup EXIT

# One cargo-mutants run per kind of test suite (cargo-mutants exits non-zero
# when a mutant survives; the scores below say which).
rm -rf "$out_root/unit" "$out_root/e2e"
mkdir -p "$out_root/unit" "$out_root/e2e"
if ((${#unit_files[@]})); then
    # process_share: the process-wide share, tested in a process of its own.
    cargo mutants "${common[@]}" "${unit_files[@]}" --output "$out_root/unit" -- --lib --test process_share || true
fi
# One run per file tested end to end, each with its own test filter.
for file in "${e2e_files[@]}"; do
    out="$out_root/e2e/$(basename "$file" .rs)-${file%%/*}"
    mkdir -p "$out"
    packages=()
    for package in $(e2e_packages "$file"); do packages+=(--test-package "$package"); done
    cargo mutants "${common[@]}" --file "$file" --test-tool nextest "${packages[@]}" --output "$out" \
        -- --max-fail 1:immediate -E "$(e2e_tests "$file")" || true
done

reports() { # reports OUTCOME: the report files of every run
    find "$out_root/unit" "$out_root/e2e" -path "*/mutants.out/$1.txt" 2>/dev/null
}
count() { # count FILE OUTCOME: mutants of FILE with that outcome, all runs
    reports "$2" | xargs -r cat | grep -c "^$1:" || true
}

echo
echo "Mutation score per file (exclusions: .cargo/mutants.toml)"
for file in "${files[@]}"; do
    caught=$(count "$file" caught) timeout=$(count "$file" timeout)
    missed=$(count "$file" missed) unviable=$(count "$file" unviable)
    printf '%-40s %4d / %-4d caught+timeout / viable  (%d missed, %d unviable)\n' \
        "$file" $((caught + timeout)) $((caught + timeout + missed)) "$missed" "$unviable"
done
if reports missed | xargs -r cat | grep -q .; then
    echo
    echo "Missed:"
    reports missed | xargs -r cat | sed 's/^/  /'
fi
