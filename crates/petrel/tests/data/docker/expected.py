#!/usr/bin/env python3
"""Reference merge of Docker json-file records into events (the *.expected.ndjson files).

Usage: expected.py FILE... > NAME.expected.ndjson   (rotated files oldest first)

Per stream, records are concatenated until one whose "log" ends with "\n";
the event's message is the concatenation without that "\n", its timestamp
the first record's "time" (Docker gives every record of a chain that time
anyway). A chain still open at the end of the input (the container's last
output had no newline) is emitted too, marked "unterminated": true.
"""
import json
import sys

open_chains = {}
order = []
for path in sys.argv[1:]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            stream, log = rec["stream"], rec["log"]
            chain = open_chains.setdefault(stream, {"time": rec["time"], "parts": []})
            chain["parts"].append(log)
            if log.endswith("\n"):
                del open_chains[stream]
                msg = "".join(chain["parts"])[:-1]
                order.append({"stream": stream, "timestamp": chain["time"], "message": msg})
for stream, chain in open_chains.items():
    order.append({"stream": stream, "timestamp": chain["time"], "message": "".join(chain["parts"]),
                  "unterminated": True})
for ev in order:
    print(json.dumps(ev, ensure_ascii=False))
