# Guest script of the VM tests and the demo: record the default probes with each backend while
# hackbench runs in a fresh memcg. BACKENDS and HACKBENCH are set by the caller.
for b in $BACKENDS; do
  echo "guest: record --attach $b -- hackbench $HACKBENCH"
  if ! memcg-trace record --attach "$b" -q -o "/out/$b.json" -- hackbench $HACKBENCH >"/out/$b.txt" 2>"/out/$b.err"; then
    echo "guest: record --attach $b failed:"
    cat "/out/$b.err" "/out/$b.txt"
    exit 1
  fi
  cat "/out/$b.txt"
done
ls /sys/fs/cgroup | grep -c '^memcg-trace\.' >/out/leftover-memcgs || true
