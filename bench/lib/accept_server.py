#!/usr/bin/env python3
"""An HTTP/1.1 endpoint on 127.0.0.1 that accepts every request at once,
for measuring a sink's own CPU (bench/sinks.sh): the server's CPU is not
the agent's.

  GET  /                 an Elasticsearch-like version document
  POST .../_bulk         200 with one `{"create":{"status":201}}` item per
                         action line (every second line of the body)
  POST .../v1/logs       200 with an empty OTLP ExportLogsServiceResponse
                         (protobuf, or `{}` for JSON)
  POST anything else     204 (Loki push, the http sink)

Counts requests and body bytes; prints them as JSON on SIGTERM/SIGINT.
Usage: accept_server.py PORT
"""
import asyncio
import json
import signal
import sys

STATS = {"requests": 0, "body_bytes": 0}
VERSION = json.dumps({"name": "bench", "version": {"number": "8.15.0", "distribution": "elasticsearch"}}).encode()


async def handle(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.split(b"\r\n")
            method, path = lines[0].split(b" ")[:2]
            length = 0
            ctype = b""
            for h in lines[1:]:
                k, _, v = h.partition(b":")
                k = k.strip().lower()
                if k == b"content-length":
                    length = int(v.strip())
                elif k == b"content-type":
                    ctype = v.strip()
            body = await reader.readexactly(length) if length else b""
            STATS["requests"] += 1
            STATS["body_bytes"] += length
            path = path.split(b"?")[0]
            if method == b"GET":
                status, answer, at = b"200 OK", VERSION, b"application/json"
            elif path.endswith(b"/_bulk"):
                n = body.count(b"\n") // 2
                answer = b'{"errors":false,"items":[' + b",".join([b'{"create":{"status":201}}'] * n) + b"]}"
                status, at = b"200 OK", b"application/json"
            elif path.endswith(b"/v1/logs"):
                status = b"200 OK"
                if b"json" in ctype:
                    answer, at = b"{}", b"application/json"
                else:
                    answer, at = b"", b"application/x-protobuf"
            else:
                status, answer, at = b"204 No Content", b"", b""
            out = b"HTTP/1.1 " + status + b"\r\n"
            if status.startswith(b"204"):
                out += b"\r\n"
            else:
                out += b"Content-Type: " + at + b"\r\nContent-Length: " + str(len(answer)).encode() + b"\r\n\r\n" + answer
            writer.write(out)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, ValueError):
        pass
    finally:
        writer.close()


async def main(port):
    server = await asyncio.start_server(handle, "127.0.0.1", port, limit=1 << 20)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for s in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(s, stop.set)
    async with server:
        await stop.wait()
    print(json.dumps(STATS), flush=True)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
