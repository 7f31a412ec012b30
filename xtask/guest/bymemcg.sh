# Guest script of the by-memcg test: the default probes with --by-memcg, with fentry and with
# kprobe, while hackbench runs in memcg A (the workload's --cgroup) and three times as much in
# memcg B, at once; then, in the same run, the same small hackbench in a memcg D1 made for it and
# removed after it, then in D2 made after that (where the kernel may reuse D1's addresses); the
# cgroup ids go back with the recordings.
echo +memory >/sys/fs/cgroup/cgroup.subtree_control
mkdir -p /sys/fs/cgroup/A /sys/fs/cgroup/B
stat -c '%i %n' /sys/fs/cgroup/A /sys/fs/cgroup/B >/out/bymemcg-ids
cat >/tmp/churn.sh <<'EOF'
for d in D1 D2; do
  mkdir /sys/fs/cgroup/$d
  stat -c '%i %n' /sys/fs/cgroup/$d >>"$1"
  sh -c "echo \$\$ >/sys/fs/cgroup/$d/cgroup.procs; exec hackbench -g 1 -l 20" >/dev/null
  rmdir /sys/fs/cgroup/$d
done
EOF
for b in fentry kprobe; do
  echo "guest: record --attach $b --by-memcg --cgroup /sys/fs/cgroup/A"
  if ! memcg-trace record --attach "$b" --by-memcg --cgroup /sys/fs/cgroup/A -q \
    -o "/out/bymemcg-$b.json" -- sh -c \
    "hackbench -g 1 -l 40 >/dev/null & sh -c 'echo \$\$ >/sys/fs/cgroup/B/cgroup.procs; exec hackbench -g 1 -l 120' >/dev/null; wait; sh /tmp/churn.sh /out/bymemcg-ids-$b" \
    >"/out/bymemcg-$b.txt" 2>"/out/bymemcg-$b.err"; then
    echo "guest: record --attach $b --by-memcg failed:"
    cat "/out/bymemcg-$b.err" "/out/bymemcg-$b.txt"
    exit 1
  fi
  cat "/out/bymemcg-$b.txt"
done
