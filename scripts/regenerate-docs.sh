#!/usr/bin/env bash
# Writes every document generated from the code into the tree: the
# component reference of the book (from the plugin registry), and the
# shell completions and man pages the Debian package installs (from the
# command line's definition). Run it after changing a plugin's DOC or
# KEY_DOCS or a subcommand, and commit the result; the test
# generated_docs fails while the committed files differ.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p petrel
bin="${CARGO_TARGET_DIR:-$PWD/target}/release/petrel"
"$bin" docs reference --out docs/src/reference
out=crates/petrel/debian/generated
rm -rf "$out"
mkdir -p "$out/man" "$out/completions"
"$bin" docs man --out "$out/man"
"$bin" docs completions bash >"$out/completions/petrel.bash"
"$bin" docs completions zsh >"$out/completions/_petrel"
"$bin" docs completions fish >"$out/completions/petrel.fish"
echo "regenerated docs/src/reference/ and $out/"
