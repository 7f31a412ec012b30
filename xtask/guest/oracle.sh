# Guest script of the oracle test: memcg-trace beside the kernel's own per-call durations
# (ftrace's function_graph tracer, filtered to the one function the probe resolves to) in the
# same run, on every vCPU. For each workload of $RUNS ("NAME PROBE FUNCTION ORDER WORKLOAD...",
# one a line; FUNCTION is what the probe resolves to on this kernel, checked by the test;
# ORDER says which hooks the function first: "fgraph-first" (function_graph set before
# memcg-trace attaches) or "tracer-first" (set by the workload's shell, after)):
# hackbench in a fresh memcg, or "reclaim": swap on zram and a memcg at a small memory.max filled
# by `tail /dev/zero`, whose charges enter reclaim, sleep and migrate. ATTACH is the backend.
#
# function_graph keeps a return stack per task: a call that sleeps, is preempted or moves to
# another CPU is one duration, nesting and interrupts included. It traces the workload's tasks
# only (set_ftrace_pid with function-fork), as memcg-trace's workload row counts them
# (fgraph-first: memcg-trace's own threads are traced too until the workload's mark, and their
# lines are left out by pid, below). The two windows differ by the instrumentation: with fentry function_graph's holds memcg-trace's (the
# BPF trampoline runs inside ftrace's hooks); with kprobe (an ftrace handler too) the hooks
# registered last are called first, so the window of the tool that hooked the function second
# holds the other's. Per workload it leaves /out/oracle-NAME.{json,txt} (memcg-trace)
# and /out/fgraph-NAME.txt: "calls N", "max_ns N", then "ge NS N" for thresholds, and the
# per-CPU ring-buffer "overrun" and "dropped" counts (calls function_graph lost).
T=/sys/kernel/tracing
[ -e $T/current_tracer ] || T=/sys/kernel/debug/tracing
echo +memory >/sys/fs/cgroup/cgroup.subtree_control
zram_ready=
while read -r name probe func order workload; do
  [ -n "$name" ] || continue
  case "$order" in
    fgraph-first) late= ;;
    tracer-first) late="echo function_graph >$T/current_tracer;" ;;
    *) echo "guest: $name: unknown order $order"; exit 1 ;;
  esac
  echo 0 >$T/tracing_on
  echo nop >$T/current_tracer
  echo 32768 >$T/buffer_size_kb
  if ! echo "$func" >$T/set_ftrace_filter; then
    echo "guest: ftrace cannot trace $func"; exit 1
  fi
  [ -n "$late" ] || echo function_graph >$T/current_tracer
  # Only the workload's tasks (its shell and all it forks, whatever interrupts them), from
  # its first instruction: the workload's shell turns tracing on for itself.
  echo 1 >$T/options/function-fork
  # Each line names its task (comm-pid), for the fgraph-first runs' filter below.
  echo 1 >$T/options/funcgraph-proc
  echo >$T/trace
  cg=
  case "$workload" in
    reclaim*)
      if [ -z "$zram_ready" ]; then
        echo 256M >/sys/block/zram0/disksize
        mkswap /dev/zram0 >/dev/null && swapon /dev/zram0
        zram_ready=1
      fi
      mkdir -p /sys/fs/cgroup/oracle
      echo 16M >/sys/fs/cgroup/oracle/memory.max
      cg="--cgroup /sys/fs/cgroup/oracle"
      cmd="timeout 4 tail /dev/zero; true"
      ;;
    *) cmd="exec $workload" ;;
  esac
  echo "guest: $name: function_graph on $func ($order) beside record --attach $ATTACH -p $probe -- $cmd"
  # fgraph-first: function_graph follows memcg-trace from its start (the pid filter on the
  # shell that execs it, with function-fork), so the workload is traced from its fork and both
  # tools see its shell's first calls. The workload's shell then sets the filter to itself
  # alone and marks the trace: before the mark only its own lines count, the others are
  # memcg-trace's threads (whose calls enter some charging functions too: try_charge on 5.10,
  # the slab hook on 7.3), whose lines after the mark do not count either. tracer-first: the
  # workload's shell sets function_graph and its own pid, so that shell's first calls are in
  # memcg-trace's row only (the test allows for them).
  rc=0
  wpid=
  rm -f /tmp/oracle-wpid
  if [ -z "$late" ]; then
    # shellcheck disable=SC2086
    sh -c "echo \$\$ >$T/set_ftrace_pid; echo 1 >$T/tracing_on; exec memcg-trace record --attach '$ATTACH' -p '$probe' $cg -q -o '/out/oracle-$name.json' -- sh -c 'echo \$\$ >/tmp/oracle-wpid; echo \$\$ >$T/set_ftrace_pid; echo workload-alone >$T/trace_marker; $cmd'" \
      >"/out/oracle-$name.txt" 2>"/out/oracle-$name.err" || rc=$?
    wpid=$(cat /tmp/oracle-wpid 2>/dev/null) || true
    if [ -z "$wpid" ]; then
      echo "guest: $name: the workload's shell left no pid"; cat "/out/oracle-$name.err"; exit 1
    fi
  else
    # shellcheck disable=SC2086
    memcg-trace record --attach "$ATTACH" -p "$probe" $cg -q -o "/out/oracle-$name.json" \
      -- sh -c "$late echo \$\$ >$T/set_ftrace_pid; echo 1 >$T/tracing_on; $cmd" >"/out/oracle-$name.txt" 2>"/out/oracle-$name.err" || rc=$?
  fi
  if [ "$rc" != 0 ]; then
    echo 0 >$T/tracing_on
    cat "/out/oracle-$name.err" "/out/oracle-$name.txt"; exit 1
  fi
  echo 0 >$T/tracing_on
  cat "/out/oracle-$name.txt"
  # One duration per call: on its return line ("}", or "func();" for a call with no traced
  # call inside), in the field between "|"s that holds "us", the number before it (after an
  # optional marker: + ! # * @ $). With WPID (fgraph-first): before the workload's mark only
  # its own lines, after it none of the pids seen before it but its own (memcg-trace's).
  awk -v wpid="$wpid" '
    BEGIN { n = split("1000 10000 100000 1000000 10000000", th, " ") }
    index($0, "/* workload-alone */") { marked = 1; next }
    index($0, "|") && index($0, " us ") {
      m = split($0, part, "|")
      us = ""
      for (j = 1; j <= m && us == ""; j++) {
        k = split(part[j], f, " ")
        for (i = 2; i <= k; i++) if (f[i] == "us") us = f[i - 1]
      }
      if (us == "") next
      if (wpid != "") {
        task = part[1]
        sub(/^[ 0-9]*\) */, "", task)
        sub(/ +$/, "", task)
        pid = task
        sub(/.*-/, "", pid)
        if (!marked && pid != wpid) { daemon[pid] = 1; skipped++; next }
        if (marked && (pid in daemon)) { skipped++; next }
      }
      ns = us * 1000
      calls++
      if (ns < 10000) { short++; short_ns += ns }
      if (ns > max) max = ns
      for (i = 1; i <= n; i++) if (ns >= th[i]) ge[i]++
    }
    END {
      printf "calls %.0f\nmax_ns %.0f\nshort %.0f %.0f\n", calls, max, short, short_ns
      for (i = 1; i <= n; i++) printf "ge %.0f %.0f\n", th[i], ge[i]
      printf "not_workload %.0f marked %.0f\n", skipped, marked
    }' $T/trace >"/out/fgraph-$name.txt"
  for c in $T/per_cpu/cpu*; do
    awk -v c="${c##*/}" '$1 == "overrun:" || $1 == "dropped" { print c, $0 }' "$c/stats"
  done >>"/out/fgraph-$name.txt"
  cat "/out/fgraph-$name.txt"
  echo nop >$T/current_tracer
  echo >$T/set_ftrace_pid
  [ -z "$cg" ] || rmdir /sys/fs/cgroup/oracle 2>/dev/null || true
done <<EOF
$RUNS
EOF
