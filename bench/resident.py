#!/usr/bin/env python3
"""What a running agent's resident memory is made of.

    bench/resident.py PID [--bin PATH]

Prints the resident kB of each mapping kind (the executable's code, its
read-only data, its relocated data, the heap, thread stacks, shared
libraries) from /proc/PID/smaps, then, for the executable, the resident
kB of each ELF section (from /proc/PID/pagemap and `readelf -SW`), so
that "the binary's pages" can be told apart: code touched, relocation
tables read once at start, data the loader relocated (anonymous), and so
on (issue 33). Reading pagemap needs root (or CAP_SYS_ADMIN) for the
present bits to be exact. Standard library only.
"""

import argparse
import collections
import os
import re
import struct
import subprocess
import sys


def mappings(pid):
    """(start, end, perms, offset, path) and the Rss/Anonymous kB of each."""
    out, cur = [], None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            m = re.match(r"^([0-9a-f]+)-([0-9a-f]+) (\S+) ([0-9a-f]+) \S+ \S+\s*(.*)$", line)
            if m:
                cur = {"start": int(m.group(1), 16), "end": int(m.group(2), 16), "perms": m.group(3),
                       "offset": int(m.group(4), 16), "path": m.group(5) or "[anon]", "rss": 0, "anon": 0}
                out.append(cur)
            elif line.startswith("Rss:"):
                cur["rss"] = int(line.split()[1])
            elif line.startswith("Anonymous:"):
                cur["anon"] = int(line.split()[1])
    return out


def sections(binary):
    """(name, address, size) of the allocated sections of `binary`."""
    text = subprocess.run(["readelf", "-SW", binary], capture_output=True, text=True, check=True).stdout
    out = []
    for line in text.splitlines():
        m = re.match(r"\s*\[\s*\d+\]\s+(\S+)\s+\S+\s+([0-9a-f]+)\s+[0-9a-f]+\s+([0-9a-f]+)", line)
        if m and int(m.group(2), 16):
            out.append((m.group(1), int(m.group(2), 16), int(m.group(3), 16)))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("pid", type=int)
    p.add_argument("--bin", help="the executable (default: /proc/PID/exe)")
    a = p.parse_args()
    binary = a.bin or os.readlink(f"/proc/{a.pid}/exe")
    maps = mappings(a.pid)

    kinds = collections.Counter()
    anon = collections.Counter()
    for m in maps:
        path = m["path"]
        if path == binary:
            kind = {"r-xp": "executable: code", "r--p": "executable: read-only (incl. relocated)",
                    "rw-p": "executable: data"}.get(m["perms"], "executable: other")
        elif path.startswith("/"):
            kind = "libraries: " + os.path.basename(path)
        else:
            kind = path  # [heap], [stack], [anon] (thread stacks, mmap'd blocks)
        kinds[kind] += m["rss"]
        anon[kind] += m["anon"]
    total = sum(kinds.values())
    print(f"{'mapping':48s} {'resident kB':>12s} {'anonymous kB':>13s}")
    for k, v in kinds.most_common():
        if v:
            print(f"{k:48s} {v:12d} {anon[k]:13d}")
    print(f"{'total (VmRSS)':48s} {total:12d} {sum(anon.values()):13d}")

    base = min((m["start"] - m["offset"] for m in maps if m["path"] == binary), default=None)
    if base is None:
        sys.exit(f"{binary} is not mapped by {a.pid}")
    print(f"\n{'section of ' + os.path.basename(binary):30s} {'size kB':>9s} {'resident kB':>12s} {'anonymous kB':>13s}")
    with open(f"/proc/{a.pid}/pagemap", "rb") as pm:
        for name, addr, size in sections(binary):
            res = an = 0
            page = (base + addr) & ~4095
            while page < base + addr + size:
                pm.seek(page // 4096 * 8)
                (v,) = struct.unpack("<Q", pm.read(8))
                if v >> 63 & 1:
                    res += 4
                    if not v >> 61 & 1:  # not file-backed: a private copy
                        an += 4
                page += 4096
            if res:
                print(f"{name:30s} {size / 1024:9.0f} {res:12d} {an:13d}")


if __name__ == "__main__":
    main()
