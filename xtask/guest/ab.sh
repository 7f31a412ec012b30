# Guest script for A/B of program variants, counted in instructions: build each variant, copy
# its binary to a path ending in mt-NAME, and run
#   cargo xtask vm --kernel 6.12 --icount 0 --bin /usr/bin/bpftrace \
#     --bin /tmp/ab/mt-base --bin /tmp/ab/mt-new --script xtask/guest/ab.sh
# then `python3 xtask/guest/ab.py target/vm/6.12-vm/out`. Per round (ROUNDS, default 1 2 3):
# untraced hackbench, bpftrace's typical latency script, then per variant a recording (full
# cost: hackbench's time) and one with --bpf-stats (each program's instructions per run; set
# NOSTATS=1 to skip). Under -icount, QEMU 7.2 sometimes corrupts a guest's flags (an oops with
# reserved RFLAGS bits set): boot again.
echo +memory >/sys/fs/cgroup/cgroup.subtree_control
mkdir -p /sys/fs/cgroup/peer
HB=${HB:-"-g 2 -l 100"}
in_memcg() { sh -c 'echo $$ >/sys/fs/cgroup/peer/cgroup.procs && exec "$@"' sh "$@"; }
memcg-trace probes -p charge,stat,rstat --attach fentry >/out/probes.txt
i=0; : >/out/peer.bt
for f in $(awk '$4 == "attached" {print $2}' /out/probes.txt); do
  i=$((i + 1))
  echo "kfunc:$f { @start$i[tid] = nsecs; }" >>/out/peer.bt
  echo "kretfunc:$f /@start$i[tid]/ { @ns$i = hist(nsecs - @start$i[tid]); delete(@start$i[tid]); }" >>/out/peer.bt
done
for r in ${ROUNDS:-1 2 3}; do
  in_memcg hackbench $HB >/out/U-$r.txt
  bpftrace /out/peer.bt >/out/B-$r.bt 2>&1 &
  bp=$!
  while ! grep -q Attaching /out/B-$r.bt; do sleep 0.2; done
  sleep 1
  in_memcg hackbench $HB >/out/B-$r.txt
  kill -INT $bp; wait $bp || true
  for v in /bin/mt-*; do
    n=${v#/bin/mt-}
    $v record -q --attach fentry -p charge,stat,rstat -o /out/F-$n-$r.json -- hackbench $HB >/out/F-$n-$r.txt 2>&1
    [ -n "$NOSTATS" ] || $v record -q --bpf-stats --attach fentry -p charge,stat,rstat -o /out/S-$n-$r.json -- hackbench $HB >/out/S-$n-$r.txt 2>&1
  done
done
