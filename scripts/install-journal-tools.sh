#!/usr/bin/env bash
# Installs what the journald source's tests and bench/journald.py need,
# only what is missing (running it again changes nothing):
#
#   systemd-journal-remote  /lib/systemd/systemd-journal-remote, which
#                           writes real journal files from export-format
#                           input (`--output=DIR/x.journal -`), apt
#   systemd                 journalctl, which the source runs and the tests
#                           compare against (`-o json`), apt
#
#   scripts/install-journal-tools.sh
#
# The package's socket and service units must not start on this machine:
# the install runs with a /usr/sbin/policy-rc.d that forbids starting
# services (exit 101), put back as it was afterwards. Needs root and
# apt-get; prints the versions at the end.
set -euo pipefail
export LC_ALL=C
export DEBIAN_FRONTEND=noninteractive

die() { echo "install-journal-tools.sh: $*" >&2; exit 1; }

REMOTE=/lib/systemd/systemd-journal-remote
if [ ! -x "$REMOTE" ] || ! command -v journalctl >/dev/null; then
  ((EUID == 0)) || die "needs root (apt-get install)"
  command -v apt-get >/dev/null || die "needs apt-get (Debian or Ubuntu)"
  policy=/usr/sbin/policy-rc.d
  saved=""
  if [ -e "$policy" ]; then
    saved=$(mktemp)
    cp -p "$policy" "$saved"
  fi
  restore() {
    if [ -n "$saved" ]; then mv -f "$saved" "$policy"; else rm -f "$policy"; fi
  }
  trap restore EXIT
  printf '#!/bin/sh\nexit 101\n' >"$policy"
  chmod 755 "$policy"
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends --no-remove systemd systemd-journal-remote >/dev/null
  restore
  trap - EXIT
fi
[ -x "$REMOTE" ] || die "$REMOTE missing after the install"
echo "journalctl: $(journalctl --version | head -n1)"
echo "systemd-journal-remote: $("$REMOTE" --version | head -n1)"
