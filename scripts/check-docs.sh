#!/usr/bin/env bash
# Builds the book (docs/, mdBook) and checks its links: every relative
# link of a chapter, and every link of README.md into docs/, must name a
# file that exists, a chapter that the book builds, and an anchor that
# the built page has. mdBook 0.4 does not check links itself (that is the
# separate mdbook-linkcheck), hence the check below.
# mdbook is built once with `cargo install --locked` into the test cache's
# cargo-tools/ (scripts/lib/cache.sh), kept across clones; the HTML goes to
# docs/book/ (git-ignored).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/cache.sh
MDBOOK_VERSION=0.4.52
tools=$PETREL_TEST_CACHE/cargo-tools
mdbook=$tools/bin/mdbook
if ! [[ -x $mdbook ]] || [[ $("$mdbook" --version) != "mdbook v$MDBOOK_VERSION" ]]; then
    echo "installing mdbook $MDBOOK_VERSION into $tools"
    # cargo install builds in a temporary directory and removes it: only
    # the binary stays.
    cargo install mdbook --locked --version "$MDBOOK_VERSION" --root "$tools"
fi
"$mdbook" --version
# `check-docs.sh --tools-only`: install mdbook (scripts/test.sh does this in
# the background while Rust compiles) and stop.
[[ ${1:-} == --tools-only ]] && exit 0
"$mdbook" build docs
python3 - <<'PY'
import os, re, sys
src, book = "docs/src", "docs/book"
link = re.compile(r"\]\(([^)\s]+)\)")
fence = re.compile(r"^\s*```")
problems = []

def ids(html_path):
    with open(html_path, encoding="utf-8") as f:
        return set(re.findall(r'\bid="([^"]+)"', f.read()))

def check(md_path, base_dir, in_book):
    in_code = False
    with open(md_path, encoding="utf-8") as f:
        for no, line in enumerate(f, 1):
            if fence.match(line):
                in_code = not in_code
            if in_code:
                continue
            # Code spans hold examples, not links.
            text = re.sub(r"`[^`]*`", "", line)
            for target in link.findall(text):
                if re.match(r"^[a-z]+:", target):
                    continue  # http:, https:, mailto:
                path, _, anchor = target.partition("#")
                where = f"{md_path}:{no}: {target}"
                dest = os.path.normpath(os.path.join(base_dir, path)) if path else md_path
                if not os.path.exists(dest):
                    problems.append(f"{where}: no such file")
                    continue
                if in_book and not os.path.abspath(dest).startswith(os.path.abspath(src) + os.sep):
                    problems.append(f"{where}: leaves docs/src (the book would not have it)")
                    continue
                if not dest.endswith(".md"):
                    continue
                rel = os.path.relpath(dest, src)
                if rel.startswith(".."):
                    continue  # a Markdown file outside the book (README links)
                html = os.path.join(book, rel[:-3] + ".html")
                if not os.path.exists(html):
                    problems.append(f"{where}: {rel} is not a chapter of SUMMARY.md")
                elif anchor and anchor not in ids(html):
                    problems.append(f"{where}: {rel} has no heading #{anchor}")

count = 0
for root, _, files in os.walk(src):
    for name in files:
        if name.endswith(".md"):
            count += 1
            path = os.path.join(root, name)
            check(path, os.path.dirname(path), True)
check("README.md", ".", False)
if problems:
    print("check-docs: broken links:", *problems, sep="\n  ", file=sys.stderr)
    sys.exit(1)
print(f"check-docs: links of {count} chapters and README.md OK")
PY
