# Guest script of the VM tests and the demo: record the default probes with each backend while
# hackbench runs in a fresh memcg. BACKENDS, HACKBENCH and STATS (extra flags for the runs of a
# forced backend, e.g. --bpf-stats) are set by the caller.
# In-kernel bucketing and pairing (BPF_PROG_TEST_RUN) and context classification on tracepoints
# of known context.
# The guest's own C library (the release binary runs with it): its version line.
"/lib/$(uname -m)-linux-gnu/libc.so.6" 2>&1 | head -1 >/out/libc.txt || true
memcg-trace selftest >/out/selftest.txt 2>&1 || { cat /out/selftest.txt; exit 1; }
# What each default probe resolves to on this kernel, and that it attaches (`probes` alone
# attaches every optional probe too: 37-60 s of start-up under emulation that no check reads).
memcg-trace probes -p charge,stat,rstat >/out/probes.txt 2>&1 || true
for b in $BACKENDS; do
  flags=""
  [ "$b" = auto ] || flags="$STATS"
  echo "guest: record --attach $b $flags -- hackbench $HACKBENCH"
  if ! memcg-trace record --attach "$b" $flags -q -o "/out/$b.json" --hdr-log "/out/$b.hlog" -- hackbench $HACKBENCH >"/out/$b.txt" 2>"/out/$b.err"; then
    echo "guest: record --attach $b failed:"
    cat "/out/$b.err" "/out/$b.txt"
    exit 1
  fi
  cat "/out/$b.txt"
done
ls /sys/fs/cgroup | grep -c '^memcg-trace\.' >/out/leftover-memcgs || true
# A failing workload: its exit status comes back, the JSON is still written.
echo "guest: a workload that exits 3"
rc=0
memcg-trace record -q -p stat -o /out/exit3.json -- sh -c 'exit 3' >/dev/null 2>/out/exit3.err || rc=$?
echo $rc >/out/exit3.status
# SIGTERM to memcg-trace mid-run: JSON written, memcg removed.
echo "guest: SIGTERM mid-run"
memcg-trace record -q -p stat -o /out/term.json -- sleep 120 >/dev/null 2>/out/term.err &
pid=$!
i=0
while [ $i -lt 600 ]; do
  for d in /sys/fs/cgroup/memcg-trace.*; do
    grep -q . "$d/cgroup.procs" 2>/dev/null && break 2
  done
  sleep 0.2
  i=$((i + 1))
done
kill -TERM $pid
rc=0
wait $pid || rc=$?
echo $rc >/out/term.status
ls /sys/fs/cgroup | grep -c '^memcg-trace\.' >/out/leftover-after-term || true
