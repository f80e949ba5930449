#!/usr/bin/env python3
"""Summary of kernel_timeline.cpp's CSV: the window between the last
cudaProfilerStart and the cudaProfilerStop after it (bench_cuda's
--profile-prefill 1: one forward), its kernels' time in the real run by
name, the idle gaps on the device between them (and whether the host's
launch came late: the launch call ended less than 5 us before the kernel
started), and the host's time before the first kernel and after the last.
Usage: timeline_report.py TIMELINE.csv"""
import collections
import csv
import re
import sys


def short(name):
    n = re.sub(r"^_Z\d+", "", name)
    for key in ("flash_prefill", "rope", "rms_norm", "silu_mul", "embed", "convert", "gemv", "sm90_xmma", "cutlass",
                "nvjet", "gemm", "splitK", "reduce", "sample", "argmax", "logits", "add"):
        if key in name:
            return key + ":" + n[:50]
    return n[:60]


rows = list(csv.DictReader(open(sys.argv[1])))
for r in rows:
    r["s"] = int(r["start_ns"])
    r["e"] = int(r["end_ns"])
starts = [r for r in rows if r["kind"] == "runtime" and r["name"].startswith("cudaProfilerStart")]
stops = [r for r in rows if r["kind"] == "runtime" and r["name"].startswith("cudaProfilerStop")]
if not starts or not stops:
    sys.exit("no cudaProfilerStart/Stop in the trace")
t0 = starts[-1]["e"]
t1 = min(r["s"] for r in stops if r["s"] > t0)
api = {r["correlation"]: r for r in rows if r["kind"] in ("runtime", "driver") and r["correlation"] != "0"}
dev = sorted((r for r in rows if r["kind"] in ("kernel", "memcpy", "memset") and t0 <= r["s"] <= t1),
             key=lambda r: r["s"])
if not dev:
    sys.exit("no device work in the window")
busy = sum(r["e"] - r["s"] for r in dev)
print(f"window {(t1 - t0) / 1e6:.3f} ms (profiler start to stop, host clock); device work {len(dev)} items, "
      f"first starts {(dev[0]['s'] - t0) / 1e3:.1f} us in, last ends {(t1 - dev[-1]['e']) / 1e3:.1f} us before the stop")
span = dev[-1]["e"] - dev[0]["s"]
print(f"device span first-to-last {span / 1e6:.3f} ms, sum of durations {busy / 1e6:.3f} ms, "
      f"idle {(span - busy) / 1e6:.3f} ms")
by = collections.defaultdict(lambda: [0, 0])
for r in dev:
    k = r["kind"] + ":" + short(r["name"]) if r["kind"] != "kernel" else short(r["name"])
    by[k][0] += r["e"] - r["s"]
    by[k][1] += 1
for k, (t, c) in sorted(by.items(), key=lambda x: -x[1][0])[:18]:
    print(f"{t / 1e6:8.3f} ms {c:5d}x {t / c / 1e3:8.1f} us  {k}")
gaps = collections.defaultdict(lambda: [0, 0, 0])
late = 0
overlap = 0
for a, b in zip(dev, dev[1:]):
    g = b["s"] - a["e"]
    if g < 0:
        overlap += -g
        continue
    key = short(a["name"])[:28] + " -> " + short(b["name"])[:28]
    gaps[key][0] += g
    gaps[key][1] += 1
    launch = api.get(b["correlation"])
    if launch and b["s"] - launch["e"] < 5000:
        gaps[key][2] += 1
        late += g
total_gap = sum(v[0] for v in gaps.values())
print(f"gaps between device items: {total_gap / 1e6:.3f} ms in all; after a late launch (host-bound): "
      f"{late / 1e6:.3f} ms; overlap (PDL): {overlap / 1e6:.3f} ms")
for k, (t, c, l) in sorted(gaps.items(), key=lambda x: -x[1][0])[:12]:
    print(f"{t / 1e3:9.1f} us {c:5d}x {t / c / 1e3:7.2f} us avg, {l} late  {k}")
api_in = [r for r in rows if r["kind"] in ("runtime", "driver") and t0 <= r["s"] <= t1]
sync = [r for r in api_in if "ynchronize" in r["name"] or "Memcpy" in r["name"] and "Async" not in r["name"]]
for r in sync:
    print(f"host {r['name']} at {(r['s'] - t0) / 1e3:.1f} us, {(r['e'] - r['s']) / 1e3:.1f} us long")
