# Guest script for measuring the programs in instructions: run it under
#   cargo xtask vm --kernel 6.12 --icount 0 --bin /usr/bin/bpftrace \
#     --script xtask/guest/instructions.sh
# where the guest clock counts executed instructions (one a nanosecond), so each program's
# bpf-stats run time per run is its instructions (plus the stats' own clock reads, the same for
# every program; interrupts landing in a program whose caller has them enabled, such as
# obj_cgroup_charge's, add theirs). Leaves in /out: B.json (`memcg-trace programs --json` while
# bpftrace's typical latency script runs, the same functions), S-fentry.json and S-kprobe.json
# (memcg-trace recordings with --bpf-stats: probes[].programs[].ns_per_run).
echo +memory >/sys/fs/cgroup/cgroup.subtree_control
mkdir -p /sys/fs/cgroup/peer
memcg-trace probes -p charge,stat,rstat --attach fentry >/out/probes.txt
i=0
: >/out/peer.bt
for f in $(awk '$4 == "attached" {print $2}' /out/probes.txt); do
  i=$((i + 1))
  echo "kfunc:$f { @start$i[tid] = nsecs; }" >>/out/peer.bt
  echo "kretfunc:$f /@start$i[tid]/ { @ns$i = hist(nsecs - @start$i[tid]); delete(@start$i[tid]); }" >>/out/peer.bt
done
HB=${HB:-"-g 2 -l 100"}
in_memcg() { sh -c 'echo $$ >/sys/fs/cgroup/peer/cgroup.procs && exec "$@"' sh "$@"; }
echo 1 >/proc/sys/kernel/bpf_stats_enabled
bpftrace /out/peer.bt >/out/B.bt 2>&1 &
bp=$!
while ! grep -q Attaching /out/B.bt; do sleep 0.2; done
sleep 2
in_memcg hackbench $HB >/out/B.txt
memcg-trace programs --json >/out/B.json
kill -INT $bp
n=0
while kill -0 $bp 2>/dev/null && [ $n -lt 100 ]; do sleep 0.2; n=$((n + 1)); done
kill -KILL $bp 2>/dev/null || true
wait $bp || true
echo 0 >/proc/sys/kernel/bpf_stats_enabled
for b in fentry kprobe; do
  memcg-trace record -q --bpf-stats --attach $b -p charge,stat,rstat -o /out/S-$b.json \
    -- hackbench $HB >/out/S-$b.txt 2>/out/S-$b.err
done
