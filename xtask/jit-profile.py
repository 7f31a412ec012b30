#!/usr/bin/env python3
"""Exact instructions per traced call of memcg-trace's programs, from QEMU's own trace.

Boots a stock kernel under TCG (`cargo xtask vm`) with QEMU logging every translation block
it runs in the BPF area (`-d in_asm,exec,nochain -dfilter`), records one probe around a short
hackbench there (xtask/guest/jit-profile.sh), and counts the machine instructions each BPF
program and trampoline ran, divided by the calls the recording counted. The programs' own code
only: the helpers and kernel functions they call (the clock, the current task) are outside the
filter. No clock is read, so the count is the same on a loaded host. The guest's clock counts
its instructions (`--icount 0`): QEMU's logging slows the emulation some tenfold, and with the
host's clock the traced calls took about 8 us each and the exits took the paths of slow calls
(see docs/bench.md, "Instructions per call").

    xtask/jit-profile.py [--kernel 6.12] [--attach fentry] [--probe charge] [--flags "--callers"]
                         [--listing fexit_lean_0]

--listing NAME prints that program's instructions with the times each ran per call.

Instructions are told apart by address and named by the programs loaded while the workload
ran: a program loaded and freed before (start-up's checks) whose code ran at an address later
reused is counted as the later one's (the counts a call of the programs named show whether
that happened: whole numbers for straight paths). The log's path must hold no space
(MEMCG_TRACE_QEMU_EXTRA is split at spaces).
"""
import argparse
import bisect
import collections
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Where x86_64 kernels put modules, BPF programs and trampolines (KASLR moves the kernel's
# text, not this range).
BPF_AREA = "0xffffffffc0000000..0xfffffffffeffffff"


def boot(kernel, attach, probe, flags, log):
    body = open(os.path.join(ROOT, "xtask/guest/jit-profile.sh")).read()
    with tempfile.NamedTemporaryFile("w", suffix=".sh", delete=False) as f:
        f.write(f"ATTACH={attach}\nPROBE={probe}\nFLAGS='{flags}'\n{body}")
        script = f.name
    env = dict(os.environ)
    env["MEMCG_TRACE_QEMU_EXTRA"] = f"-d in_asm,exec,nochain -dfilter {BPF_AREA} -D {log}"
    try:
        subprocess.run(
            ["cargo", "xtask", "vm", "--kernel", kernel, "--cpus", "1", "--icount", "0",
             "--script", script],
            cwd=ROOT, env=env, check=True)
    finally:
        os.unlink(script)
    return os.path.join(ROOT, f"target/vm/{kernel}-vm/out")


def symbols(path):
    syms = []
    for line in open(path):
        addr, _, name = line.split()[:3]
        syms.append((int(addr, 16), name))
    syms.sort()
    return syms


def count(log):
    """Per instruction address: how many times it ran; and each one's text."""
    blocks = {}  # a block's first address -> its instructions' addresses
    waiting = collections.Counter()  # blocks run before their listing was read
    runs = collections.Counter()
    text = {}
    block = None
    for line in open(log, errors="replace"):
        if line.startswith("Trace "):
            m = re.search(r"\[[0-9a-f]+/([0-9a-f]+)/", line)
            pc = int(m.group(1), 16)
            if pc in blocks:
                for a in blocks[pc]:
                    runs[a] += 1
            else:
                waiting[pc] += 1
            block = None
        elif line.startswith("IN:"):
            block = []
        elif block is not None and line.startswith("0x"):
            m = re.match(r"0x([0-9a-f]+):\s+(?:[0-9a-f]{2} )+\s*(.*)", line)
            if m:
                pc = int(m.group(1), 16)
                block.append(pc)
                text[pc] = m.group(2).strip()
                blocks[block[0]] = block
        elif block is not None and not line.strip():
            if block and block[0] in waiting:
                n = waiting.pop(block[0])
                for a in block:
                    runs[a] += n
            block = None
    return runs, text


def owner(syms, pc):
    i = bisect.bisect_right([a for a, _ in syms], pc) - 1
    if i < 0 or pc - syms[i][0] > 0x8000:
        return None
    return syms[i]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kernel", default="6.12")
    ap.add_argument("--attach", default="fentry")
    ap.add_argument("--probe", default="charge")
    ap.add_argument("--flags", default="")
    ap.add_argument("--listing", action="append", default=[])
    a = ap.parse_args()
    log = os.path.join(ROOT, "target/jit-profile.log")
    out = boot(a.kernel, a.attach, a.probe, a.flags, log)
    calls = json.load(open(os.path.join(out, "profiled.json")))["probes"][0]["count"]
    syms = symbols(os.path.join(out, "bpf-symbols.txt"))
    runs, text = count(log)
    per = collections.Counter()
    for pc, n in runs.items():
        s = owner(syms, pc)
        per[s[1] if s else "(outside the programs' symbols)"] += n
    print(f"{a.kernel}, --attach {a.attach} -p {a.probe} {a.flags}".rstrip() + f": {calls} calls")
    print("instructions a call  program")
    for name, n in per.most_common():
        if n >= calls / 10:
            print(f"{n / calls:19.1f}  {name}")
    for want in a.listing:
        start = next((s for s in syms if s[1].endswith("_" + want) or s[1] == want), None)
        if start is None:
            sys.exit(f"no program {want} among the BPF symbols")
        print(f"\n{start[1]} (runs a call, offset, instruction):")
        for pc in sorted(p for p in text if owner(syms, p) == start):
            print(f"{runs.get(pc, 0) / calls:7.2f} {pc - start[0]:5x}  {text[pc]}")


if __name__ == "__main__":
    main()
