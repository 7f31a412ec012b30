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
                         [--listing fexit_lean_0] [--helpers]

--listing NAME prints that program's instructions with the times each ran per call.

--helpers counts the kernel functions the programs and the trampoline call too (the clock, the
current task; the trampoline's enter and exit functions), to the end of each call: the guest
boots with `nokaslr`, so that their addresses are the same every boot, and boots again with
each function the last boot saw called added to the filter, until no new one is (at most
MAX_BOOTS boots, said if the closure was not reached; a function reached only by an indirect
call is found by name: the clocksource's read function and the retpoline thunks; weak
functions are among the kernel's text symbols too). An instruction of such a function is
counted only between a call (not a jump) made by BPF code and the next BPF instruction run:
the same function run from elsewhere is not counted, an interrupt taken inside such a call
is. The traced function itself, which the trampoline calls, is never followed. The "BPF
code" is the whole area above (modules too: the guest loads none).

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


def boot(kernel, attach, probe, flags, log, ranges=(), helpers=False):
    body = open(os.path.join(ROOT, "xtask/guest/jit-profile.sh")).read()
    with tempfile.NamedTemporaryFile("w", suffix=".sh", delete=False) as f:
        f.write(f"ATTACH={attach}\nPROBE={probe}\nFLAGS='{flags}'\nHELPERS={int(helpers)}\n{body}")
        script = f.name
    env = dict(os.environ)
    area = ",".join([BPF_AREA] + [f"{lo:#x}..{hi - 1:#x}" for lo, hi in ranges])
    env["MEMCG_TRACE_QEMU_EXTRA"] = f"-d in_asm,exec,nochain -dfilter {area} -D {log}"
    if helpers:
        env["MEMCG_TRACE_KERNEL_APPEND"] = "nokaslr"
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
    """Per instruction address: how many times it ran; each one's text; each block's
    instructions by its first address; the blocks in the order they ran."""
    blocks = {}  # a block's first address -> its instructions' addresses
    waiting = collections.Counter()  # blocks run before their listing was read
    runs = collections.Counter()
    text = {}
    block = None
    seq = []
    for line in open(log, errors="replace"):
        if line.startswith("Trace "):
            m = re.search(r"\[[0-9a-f]+/([0-9a-f]+)/", line)
            pc = int(m.group(1), 16)
            seq.append(pc)
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
    return runs, text, blocks, seq


BPF_LO, BPF_HI = (int(x, 16) for x in BPF_AREA.split(".."))
TARGET = re.compile(r"^(callq|call|jmpq|jmp)\s+0x([0-9a-f]+)$")
# Boots of --helpers at most (the closure took five for the lean pair on 6.12).
MAX_BOOTS = 8
# Reached by indirect calls: by name (the clocksource's read function, by the clocksource's
# name; the retpoline thunks).
CLOCK_READ = {"tsc": "read_tsc", "hpet": "read_hpet", "acpi_pm": "acpi_pm_read",
              "kvm-clock": "kvm_clock_get_cycles", "jiffies": "jiffies_read"}


def in_bpf(pc):
    return BPF_LO <= pc <= BPF_HI


def functions(path):
    """The kernel's text symbols: sorted (start, end, name), each ending where the next
    begins."""
    first = {}  # address -> its first name (aliases share an address)
    for line in open(path):
        f = line.split()
        if len(f) >= 3 and int(f[0], 16):
            first.setdefault(int(f[0], 16), f[2])
    starts = sorted(first.items())
    return [(a, starts[i + 1][0] if i + 1 < len(starts) else a + 16, n)
            for i, (a, n) in enumerate(starts)]


class Functions:
    """Kernel functions by address (see `functions`)."""

    def __init__(self, funcs):
        self.funcs = funcs
        self.starts = [f[0] for f in funcs]

    def at(self, pc):
        i = bisect.bisect_right(self.starts, pc) - 1
        return self.funcs[i] if i >= 0 and pc < self.funcs[i][1] else None


def followed(seq, blocks, text, bpf_syms, funcs, traced):
    """Instructions run inside the calls BPF code makes, per (caller, kernel function), and
    the functions called (directly) from there or from BPF code: (counts, targets)."""
    per = collections.Counter()
    targets = set()
    caller = None  # "programs" or "trampoline" while inside such a call
    for pc in seq:
        block = blocks.get(pc, [])
        last = text.get(block[-1], "") if block else ""
        m = TARGET.match(last)
        target = int(m.group(2), 16) if m else None
        if in_bpf(pc):
            caller = None
            # A call opens a window; a jump out of BPF code (a return thunk) does not.
            if target is not None and not in_bpf(target) and m.group(1).startswith("call"):
                f = funcs.at(target)
                if f and f[2] not in traced:
                    targets.add(f)
                    s = owner(bpf_syms, pc)
                    caller = "programs" if s and s[1].startswith("bpf_prog_") else "trampoline"
            continue
        if caller is None:
            continue
        f = funcs.at(pc)
        per[(caller, f[2] if f else hex(pc))] += len(block)
        if target is not None and not in_bpf(target):
            g = funcs.at(target)
            if g and g[2] not in traced:
                targets.add(g)
    return per, targets


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
    ap.add_argument("--helpers", action="store_true")
    a = ap.parse_args()
    log = os.path.join(ROOT, "target/jit-profile.log")
    ranges = set()
    closed = not a.helpers
    for round_ in range(1, MAX_BOOTS + 1 if a.helpers else 2):
        out = boot(a.kernel, a.attach, a.probe, a.flags, log, sorted(ranges), a.helpers)
        doc = json.load(open(os.path.join(out, "profiled.json")))
        calls = doc["probes"][0]["count"]
        syms = symbols(os.path.join(out, "bpf-symbols.txt"))
        runs, text, blocks, seq = count(log)
        if not a.helpers:
            break
        funcs = Functions(functions(os.path.join(out, "kernel-symbols.txt")))
        traced = {doc["probes"][0]["target"]}
        by_name = {f[2]: f for f in funcs.funcs}
        clock = open(os.path.join(out, "clocksource.txt")).read().strip()
        named = {by_name[n] for n in [CLOCK_READ.get(clock, "")] if n in by_name}
        named |= {f for f in funcs.funcs if f[2].startswith("__x86_indirect_thunk_")}
        helper_runs, targets = followed(seq, blocks, text, syms, funcs, traced)
        new = {(lo, hi) for lo, hi, _ in targets | named} - ranges
        print(f"helpers, boot {round_}: {len(ranges)} functions followed, {len(new)} more called",
              file=sys.stderr)
        if not new:
            closed = True
            break
        ranges |= new
    if not closed:
        print(f"helpers: NOT CLOSED after {MAX_BOOTS} boots: functions the last boot saw called "
              f"were not followed, their instructions are missing below", file=sys.stderr)
    per = collections.Counter()
    for pc, n in runs.items():
        if in_bpf(pc):
            s = owner(syms, pc)
            per[s[1] if s else "(outside the programs' symbols)"] += n
    print(f"{a.kernel}, --attach {a.attach} -p {a.probe} {a.flags}".rstrip() + f": {calls} calls")
    print("instructions a call  program")
    for name, n in per.most_common():
        if n >= calls / 10:
            print(f"{n / calls:19.1f}  {name}")
    if a.helpers:
        print(f"\nkernel functions called, to the end of each call (clocksource {clock}):")
        print("instructions a call  called by   function")
        for who in ["programs", "trampoline"]:
            total = sum(n for (c, _), n in helper_runs.items() if c == who)
            for (c, name), n in helper_runs.most_common():
                if c == who and n >= calls / 10:
                    print(f"{n / calls:19.1f}  {who:10}  {name}")
            print(f"{total / calls:19.1f}  {who:10}  (all)")
    for want in a.listing:
        start = next((s for s in syms if s[1].endswith("_" + want) or s[1] == want), None)
        if start is None:
            sys.exit(f"no program {want} among the BPF symbols")
        print(f"\n{start[1]} (runs a call, offset, instruction):")
        for pc in sorted(p for p in text if owner(syms, p) == start):
            print(f"{runs.get(pc, 0) / calls:7.2f} {pc - start[0]:5x}  {text[pc]}")


if __name__ == "__main__":
    main()
