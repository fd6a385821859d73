#!/usr/bin/env python3
"""User-space instructions of one pipeline run, free of the noise of a shared
machine (BENCHMARKS.md section 21).

    bench/instructions.py BIN DATASET SINK [parse] [THREADS]

Runs `BIN run` under `valgrind --tool=callgrind` over the first 32 MiB of
bench/out/data/DATASET-1GiB.log (generate it with bench/run.sh first), the
pipeline written as bench/petrel_bench.py writes it (SINK: text, ndjson,
...; `parse` adds the data set's parser), the file sink's output on
/dev/shm; stops the agent once the output has every line and prints the
instruction count (callgrind's Ir: user space only, so the kernel's read
and write copies are not in it). `callgrind_annotate OUT` shows where they
go. Needs valgrind.
"""
import os, subprocess, sys, time, signal, re, shutil
bin_, ds, sink = sys.argv[1:4]
parse = len(sys.argv) > 4 and sys.argv[4] == "parse"
threads = sys.argv[5] if len(sys.argv) > 5 else "1"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import petrel_bench as pb
IR = os.path.join(ROOT, "bench", "out", "ir")
os.makedirs(IR, exist_ok=True)
src = os.path.join(ROOT, "bench", "out", "data", f"{ds}-1GiB.log")
sl = os.path.join(IR, f"{ds}-32MiB.log")
if not os.path.exists(sl):
    with open(src, "rb") as f: data = f.read(32 << 20)
    data = data[: data.rindex(b"\n") + 1]
    open(sl, "wb").write(data)
lines = sum(1 for _ in open(sl, "rb"))
tag = os.path.basename(os.path.dirname(bin_)) + "-" + os.path.basename(bin_)
wd = os.path.join(IR, f"wd-{ds}-{sink}-{parse}-{tag}")
shutil.rmtree(wd, ignore_errors=True); os.makedirs(wd)
out = f"/dev/shm/petrel-ir-{os.getpid()}.out"
cfg = os.path.join(wd, "p.yaml")
pb.write_pipeline(cfg, sl, sink, "beginning", ds if parse else None, out)
cg = os.path.join(IR, f"cg-{ds}-{sink}-{'parse' if parse else 'raw'}-t{threads}-{tag}.out")
p = subprocess.Popen(["valgrind", "--tool=callgrind", f"--callgrind-out-file={cg}", bin_, "run", "--config", cfg,
                      "--data-dir", os.path.join(wd, "data"), "--api-addr", "127.0.0.1:0", "--threads", threads,
                      "--log-level", "warn"], stdout=subprocess.DEVNULL, stderr=open(os.path.join(wd, "log"), "w"))
t0 = time.time()
while True:
    time.sleep(0.5)
    try:
        n = subprocess.run(["wc", "-l", out], capture_output=True, text=True).stdout.split()[0]
        if int(n) >= lines: break
    except Exception: pass
    if time.time() - t0 > 600 or p.poll() is not None: sys.exit("timeout or exit")
p.send_signal(signal.SIGTERM); p.wait()
os.unlink(out)
summ = [l for l in open(cg) if l.startswith("summary:") or l.startswith("totals:")]
ir = int(summ[-1].split()[1])
print(f"{ds} {sink} {'parse' if parse else 'raw'} t{threads} {tag}: {ir/1e6:.1f} M Ir, {ir/ (os.path.getsize(sl)/1e9)/1e9:.3f} G Ir per GB (slice {os.path.getsize(sl)} B, {lines} lines) -> {cg}")
