#!/usr/bin/env bash
# image.sh — the Petrel container image as an OCI archive, without a registry
# or a Docker daemon (umoci only, see scripts/lib/oci.sh).
#
#   scripts/image.sh            builds target/image/petrel-oci.tar from
#                               target/release/petrel (cargo build --release
#                               -p petrel first when it is missing)
#
# Env: PETREL  the binary to put in (a path; then nothing is built)
#      OUT     the archive (default target/image/petrel-oci.tar)
#      PETREL_SOURCE_URL  org.opencontainers.image.source (default: the git
#                         remote `origin` without credentials, else a placeholder)
#
# The image: /usr/bin/petrel (debug info stripped from a copy), the build
# host's /usr/bin/journalctl (env JOURNALCTL: another one; for the journald
# source), the shared libraries `ldd` names for both and the loader, /etc/ssl/certs/ca-certificates.crt,
# /etc/passwd and /etc/group with root and petrel (65532, for running
# non-root), /etc/nsswitch.conf, and empty mount points /var/lib/petrel
# (the data dir, a writable volume: the root can be read-only) and
# /etc/petrel/pipelines. Entrypoint /usr/bin/petrel, default arguments the
# DaemonSet's (deploy/kubernetes/daemonset.yaml), user 0 as there. Tagged
# with the crate version: `ctr -n k8s.io images import --base-name
# localhost/petrel petrel-oci.tar` names it localhost/petrel:<version>.
# Fails when the archive is over 30 MB.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=lib/oci.sh
. "$REPO/scripts/lib/oci.sh"

MAX_BYTES=30000000
OUT=${OUT:-$REPO/target/image/petrel-oci.tar}

die() {
  echo "image.sh: error: $*" >&2
  exit 1
}
for t in umoci ldd strip tar; do
  command -v "$t" >/dev/null || die "$t not found (umoci: scripts/cri-lab.sh setup installs it)"
done
[ -f /etc/ssl/certs/ca-certificates.crt ] || die "/etc/ssl/certs/ca-certificates.crt missing (apt-get install ca-certificates)"

if [ -n "${PETREL:-}" ]; then
  bin=$PETREL
else
  bin=$REPO/target/release/petrel
  if [ ! -x "$bin" ]; then
    echo "image.sh: cargo build --release -p petrel" >&2
    cargo build --release --locked -p petrel --manifest-path "$REPO/Cargo.toml"
  fi
fi
[ -x "$bin" ] || die "$bin is not an executable"

# Version and revision from the binary itself (`petrel 0.1.0 (0123456789ab)`),
# so the labels describe what is inside, whichever commit is checked out.
ver_line=$("$bin" --version) || die "$bin --version failed"
[[ $ver_line =~ ^petrel\ ([^ ]+)\ \(([^\)]+)\)$ ]] || die "unexpected version line: $ver_line"
version=${BASH_REMATCH[1]}
revision=${BASH_REMATCH[2]}
license=$(sed -n 's/^license *= *"\(.*\)"/\1/p' "$REPO/Cargo.toml" | head -n1)
[ -n "$license" ] || die "no license in the workspace Cargo.toml"
source_url=${PETREL_SOURCE_URL:-$(git -C "$REPO" config --get remote.origin.url 2>/dev/null || true)}
# A remote may carry credentials (https://user:token@host/...): never in a label.
source_url=$(sed -E 's#^([a-z+]+://)[^/@]*@#\1#' <<<"$source_url")
source_url=${source_url:-https://example.org/petrel}
created=$(date -u +%Y-%m-%dT%H:%M:%SZ)

work=$(mktemp -d "${TMPDIR:-/tmp}/petrel-image.XXXXXX")
trap 'rm -rf "$work"' EXIT
r=$work/rootfs
mkdir -p "$r/usr/bin" "$r/etc/ssl/certs" "$r/var/lib/petrel" "$r/etc/petrel/pipelines" "$r/tmp"
chmod 1777 "$r/tmp"
cp "$bin" "$r/usr/bin/petrel"
strip --strip-debug "$r/usr/bin/petrel"
chmod 755 "$r/usr/bin/petrel"

# The shared libraries and the loader, at the paths the binary asks for
# (`libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6`, `/lib64/ld-linux-x86-64.so.2`);
# -L: the files, not the host's symlinks (usrmerge makes /lib one).
copy_libs() {
  local libs
  libs=$(ldd "$1" 2>&1 || true)
  if grep -qE 'not a dynamic executable|statically linked' <<<"$libs"; then
    echo "image.sh: $1 is static, no shared library copied" >&2
    return
  fi
  grep -q 'not found' <<<"$libs" && die "ldd $1: a library is missing: $libs"
  while read -r lib; do
    mkdir -p "$r$(dirname "$lib")"
    [ -e "$r$lib" ] || cp -L "$lib" "$r$lib"
  done < <(awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' <<<"$libs" | sort -u)
}
copy_libs "$r/usr/bin/petrel"
# journalctl for the `journald` source (it reads the host's journal,
# mounted read-only, through `journalctl --output=export`): the build
# host's, with its libraries (libsystemd-shared). It must be at least as
# new as the systemd of the nodes' journals; the source says so when not.
JOURNALCTL=${JOURNALCTL:-$(command -v journalctl || true)}
[ -n "$JOURNALCTL" ] && [ -x "$JOURNALCTL" ] ||
  die "journalctl not found (apt-get install systemd, or JOURNALCTL=path): the journald source needs it in the image"
cp -L "$JOURNALCTL" "$r/usr/bin/journalctl"
chmod 755 "$r/usr/bin/journalctl"
copy_libs "$r/usr/bin/journalctl"
cp -L /etc/ssl/certs/ca-certificates.crt "$r/etc/ssl/certs/"
cat >"$r/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/usr/sbin/nologin
petrel:x:65532:65532:petrel:/var/lib/petrel:/usr/sbin/nologin
EOF
cat >"$r/etc/group" <<'EOF'
root:x:0:
petrel:x:65532:
EOF
# glibc's lookups without the host's configuration: files, then DNS.
printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$r/etc/nsswitch.conf"
chmod 644 "$r/etc/passwd" "$r/etc/group" "$r/etc/nsswitch.conf"
if [ "$(id -u)" = 0 ]; then
  chown -R 0:0 "$r"
fi

# The binary runs inside the image's files alone (its loader, its
# libraries): proves the copy is complete before anything is packed.
# chroot needs root; otherwise the container test is the proof.
if [ "$(id -u)" = 0 ]; then
  in_image=$(chroot "$r" /usr/bin/petrel --version) || die "petrel does not run inside the image's root"
  [ "$in_image" = "$ver_line" ] || die "inside the image: '$in_image', outside: '$ver_line'"
  # And as the image's non-root user (the files it needs are world-readable).
  chroot --userspec=65532:65532 "$r" /usr/bin/petrel --version >/dev/null ||
    die "petrel does not run as uid 65532 inside the image's root"
  chroot "$r" /usr/bin/journalctl --version >/dev/null ||
    die "journalctl does not run inside the image's root"
else
  echo "image.sh: not root, the image's root was not tried with chroot" >&2
fi

mkdir -p "$(dirname "$OUT")"
oci_archive "$work/oci" "$r" "$version" "$OUT" \
  --config.entrypoint /usr/bin/petrel \
  --config.cmd=run --config.cmd=--config=/etc/petrel/pipelines/ \
  --config.cmd=--data-dir=/var/lib/petrel --config.cmd=--api-addr=0.0.0.0:8686 \
  --config.user 0:0 \
  --config.workingdir / \
  --config.env PATH=/usr/bin \
  --config.exposedports 8686/tcp \
  --config.stopsignal SIGTERM \
  --created "$created" \
  --author "Petrel developers" \
  --config.label "org.opencontainers.image.title=petrel" \
  --config.label "org.opencontainers.image.description=Log collection agent" \
  --config.label "org.opencontainers.image.version=$version" \
  --config.label "org.opencontainers.image.revision=$revision" \
  --config.label "org.opencontainers.image.source=$source_url" \
  --config.label "org.opencontainers.image.licenses=$license" \
  --config.label "org.opencontainers.image.created=$created"

size=$(stat -c %s "$OUT")
if [ "$size" -gt "$MAX_BYTES" ]; then
  # Removed, so that nothing imports an image that broke the limit.
  rm -f "$OUT"
  die "$OUT is $size bytes, over the $MAX_BYTES-byte limit"
fi
echo "image.sh: $OUT ($size bytes): petrel $version ($revision), tag $version" >&2
echo "$OUT"
