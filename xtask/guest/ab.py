"""Summary of xtask/guest/ab.sh's output: full cost per traced call of each variant and of
bpftrace, their ratio per round, and each variant's programs in instructions per run.
Usage: python3 xtask/guest/ab.py OUT_DIR"""
import collections, glob, json, os, re, statistics, sys

os.chdir(sys.argv[1] if len(sys.argv) > 1 else 'target/vm/6.12-vm/out')


def seconds(path):
    m = re.search(r'Time: ([0-9.]+)', open(path).read())
    return float(m.group(1)) if m else None


rounds = sorted({f[2:-4] for f in glob.glob('U-*.txt')})
variants = sorted({f[2:].rsplit('-', 1)[0] for f in glob.glob('F-*.json')})
ratios = collections.defaultdict(list)
for r in rounds:
    untraced, peer = seconds(f'U-{r}.txt'), seconds(f'B-{r}.txt')
    line = f'round {r}: untraced {untraced:.3f} s, bpftrace {peer:.3f} s'
    for v in variants:
        if not os.path.exists(f'F-{v}-{r}.json'):
            continue
        calls = sum(p['count'] for p in json.load(open(f'F-{v}-{r}.json'))['probes'])
        traced = seconds(f'F-{v}-{r}.txt')
        ours, theirs = (traced - untraced) / calls * 1e9, (peer - untraced) / calls * 1e9
        ratios[v].append(ours / theirs)
        line += f' | {v} {traced:.3f} s: {ours:.0f} per call, bpftrace {theirs:.0f}: {ours / theirs:.3f}x'
    print(line)
for v in variants:
    print(f'{v}: median {statistics.median(ratios[v]):.3f}x of bpftrace', [round(x, 3) for x in ratios[v]])
    for f in sorted(glob.glob(f'S-{v}-*.json')):
        progs = [g for p in json.load(open(f))['probes'] for g in p.get('programs', [])]
        print('   ', ' '.join(f"{g['name']}:{round(g['ns_per_run'])}" for g in progs))
