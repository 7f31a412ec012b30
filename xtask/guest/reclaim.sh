# Guest script of the reclaim test: swap on zram (the initramfs has nothing else to reclaim),
# a memcg with a small memory.max, and a workload that keeps allocating, so that its charges
# enter reclaim. MEMORY_MAX and SECONDS_ are set by the caller.
if [ -w /sys/block/zram0/comp_algorithm ]; then
  echo lz4 > /sys/block/zram0/comp_algorithm 2>/dev/null || true
fi
echo 256M > /sys/block/zram0/disksize
mkswap /dev/zram0 >/dev/null
swapon /dev/zram0
echo +memory > /sys/fs/cgroup/cgroup.subtree_control
mkdir /sys/fs/cgroup/reclaim
echo "$MEMORY_MAX" > /sys/fs/cgroup/reclaim/memory.max
# Beside it, empty files made one after another in a tmpfs: each charges kernel objects (an
# inode, a dentry) through obj_cgroup_charge, which enters reclaim at memory.max, so that
# try_charge runs nested in charge and can sleep there.
mkdir /tmp/reclaim
echo "guest: record -p try_charge,charge while tail /dev/zero fills a memcg of $MEMORY_MAX and files are made beside it"
if ! memcg-trace record -p try_charge,charge --bpf-stats -q --cgroup /sys/fs/cgroup/reclaim \
    -o /out/reclaim.json -- sh -c "timeout $SECONDS_ tail /dev/zero & i=0; while [ \$i -lt 4000 ]; do : > /tmp/reclaim/f\$i; i=\$((i+1)); done; wait; true" \
    >/out/reclaim.txt 2>/out/reclaim.err; then
  cat /out/reclaim.err /out/reclaim.txt
  exit 1
fi
cat /out/reclaim.txt
cat /sys/fs/cgroup/reclaim/memory.events >/out/memory.events
grep -E "^(pgscan|pgsteal|pswpout) " /sys/fs/cgroup/reclaim/memory.stat >/out/memory.stat || true
cat /out/memory.events /out/memory.stat
