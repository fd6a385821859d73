#!/usr/bin/env bash
# Installs the real clients the end-to-end tests drive, where missing:
# util-linux `logger` (syslog over UDP, TCP and Unix sockets) and the
# `openssl` command (a TLS client and test certificates), and `tmux` (a
# real terminal for `petrel top`). Debian packages.
set -euo pipefail
need=()
command -v logger >/dev/null 2>&1 || need+=(bsdutils)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
command -v tmux >/dev/null 2>&1 || need+=(tmux)
if ((${#need[@]})); then
    echo "installing: ${need[*]}"
    if [[ $(id -u) -ne 0 ]]; then
        echo "the tests need ${need[*]}; run as root or install them" >&2
        exit 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
echo "logger: $(logger --version 2>&1 | head -1)"
echo "openssl: $(openssl version)"
echo "tmux: $(tmux -V)"
