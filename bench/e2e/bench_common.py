"""Helpers the end-to-end benchmarks share (standard library only)."""
import json
import platform
import subprocess


def cpu_name():
    """The CPU's model name from /proc/cpuinfo (platform.processor() elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def rill_bench(rill, model, threads, *args):
    """Runs `rill bench MODEL --threads T --json ARGS...`; returns (argv, parsed JSON)."""
    cmd = [rill, "bench", model, "--threads", str(threads), "--json", *map(str, args)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return cmd, json.loads(out)
