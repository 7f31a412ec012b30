# Guest script of the profiler comparison (issue "Where the workload's CPU goes"): hackbench
# under memcg-trace (each backend of $BACKENDS, the default probes, the workload in its fresh
# memcg) while perf samples that memcg's tasks (software clock, kernel callchains) in the same
# run. The workload waits 3 s before hackbench, for perf to start on the memcg. Per traced
# function, the perf samples whose callchain holds it (inclusive) and those whose innermost
# traced function it is (what memcg-trace's self time counts) come back as counts.
echo +memory >/sys/fs/cgroup/cgroup.subtree_control
HB=${HB:-'-g 2 -l 100'}
for b in $BACKENDS; do
  echo "guest: record --attach $b, perf record -G its memcg"
  memcg-trace record --attach "$b" $PROBES -q -o "/out/profile-$b.json" -- sh -c "sleep 3; exec hackbench $HB" \
    >"/out/profile-$b.txt" 2>"/out/profile-$b.err" &
  mt=$!
  i=0
  while [ ! -d "/sys/fs/cgroup/memcg-trace.$mt" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
  perf record -a -e cpu-clock -F "${FREQ:-4000}" -g -G "memcg-trace.$mt" -o "/tmp/perf-$b.data" \
    >/dev/null 2>"/out/perf-record-$b.err" &
  perf=$!
  if ! wait $mt; then
    cat "/out/profile-$b.err" "/out/profile-$b.txt"
    exit 1
  fi
  kill -INT $perf
  wait $perf || true  # perf ends on the SIGINT with 130
  # The functions traced, by the summary's footnotes ("NAME TARGET via ...").
  targets=$(awk '$3 == "via" { printf "%s%s", sep, $2; sep = "," }' "/out/profile-$b.txt")
  perf script -i "/tmp/perf-$b.data" -F ip,sym 2>"/out/perf-script-$b.err" | awk -v targets="$targets" '
    # A frame of the instrumentation: a BPF program or trampoline (unnamed kernel text is
    # JIT code here), or the kprobe and return-probe machinery that runs the programs.
    function instr(s) {
      return s ~ /^bpf_prog_/ || s ~ /^bpf_trampoline_/ || s == "[unknown]" ||
        s ~ /^(kprobe_ftrace_handler|kprobe_dispatcher|kretprobe_dispatcher|kprobe_perf_func|kretprobe_perf_func|trace_call_bpf|arch_rethook_trampoline|arch_rethook_trampoline_callback|rethook_trampoline_handler|kretprobe_rethook_handler|__kretprobe_trampoline|kretprobe_trampoline)$/
    }
    BEGIN { n = split(targets, t, ","); for (i = 1; i <= n; i++) want[t[i]] = 1 }
    function done_sample() {
      if (inside) {
        total++
        if (ins) instrumentation++
        else {
          if (hit != "") self[hit]++
          for (k in seen) incl[k]++
        }
      }
      inside = 0; hit = ""; ins = 0; split("", seen)
    }
    /^[ \t]*$/ { done_sample(); next }
    {
      s = $2; sub(/\+0x[0-9a-f]+$/, "", s)
      # User-space frames end the kernel chain.
      if ($1 !~ /^ffff/) { inside = 1; next }
      # Innermost first: instrumentation reached before any traced function.
      if (hit == "" && !ins && instr(s)) ins = 1
      inside = 1
      if (s in want) { if (hit == "") hit = s; seen[s] = 1 }
    }
    END {
      done_sample(); print "samples", total
      print "instrumentation", instrumentation + 0
      for (i = 1; i <= n; i++) print t[i], self[t[i]] + 0, incl[t[i]] + 0
    }
  ' >"/out/perf-shares-$b.txt"
  if ! grep -q '^samples [1-9]' "/out/perf-shares-$b.txt"; then
    echo "guest: perf took no sample of W"
    cat "/out/perf-record-$b.err" "/out/perf-script-$b.err"
    exit 1
  fi
  cat "/out/perf-shares-$b.txt"
done
