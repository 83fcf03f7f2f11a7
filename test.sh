#!/usr/bin/env bash
# Runs every check of ringfs: formatting, lints, unit tests and the multi-process
# end-to-end tests (real servers on loopback). Exits non-zero if anything fails.
set -euo pipefail
cd "$(dirname "$0")"
source scripts/setup.sh
echo "== formatting"
cargo fmt --all -- --check
echo "== lints"
cargo clippy --workspace --all-targets --quiet -- -D warnings
echo "== unit and end-to-end tests"
cargo test --workspace --quiet
echo "== all tests passed"
