# Guest script of the profiler comparison (issue "Where the workload's CPU goes"): hackbench
# under memcg-trace (each backend of $BACKENDS, the probes $PROBES, the workload in its fresh
# memcg) while perf samples every CPU (software clock, kernel callchains) in the same run. The
# workload waits 3 s before hackbench, for perf to be running.
#
# Each sample stands for the time since the previous sample on its CPU, not for one period: a
# timer expiry that could not interrupt (interrupts off, or a vCPU waiting for its turn on the
# host) fires once when it can, for all the time that passed, and that time belongs to where
# it fires, as it does in the guest's own clock (and in the cgroup's CPU usage). Counted
# unweighted, those stretches would shrink to one period. Samples of the workload: those of
# tasks named hackbench (the cgroup's other task, the shell that execs it, takes next to no
# CPU). Per traced function, the samples whose callchain holds it (inclusive) and
# those whose innermost traced function it is (what memcg-trace's self time counts), reached
# before any instrumentation, come back as counts and as weighted ns (and the sum of the
# squared weights, for the effective number of samples). Once per sampling rate of $FREQS
# (`profile-$b-$f.json`, `perf-shares-$b-$f.txt`): under an instruction-counted guest clock
# perf's share of a function moves with its rate (its ticks and its handler's cost fall in
# step with the workload), and the spread across rates shows by how much. Then the same
# recording without perf, in rounds (`alone-$b-$i.json`).
echo +memory >/sys/fs/cgroup/cgroup.subtree_control
HB=${HB:-'-g 2 -l 100'}
# What one context switch costs here, at most (half a round trip of perf's pipe benchmark:
# two switches and a pipe write and read): memcg-trace's time off the CPU runs between the
# scheduler's clock updates, which lie up to that far from the switches themselves.
perf bench sched pipe -l 5000 2>/dev/null | awk '$2 == "usecs/op" { printf "%.0f\n", $1 * 1000 / 2 }' >/out/switch-ns.txt
if ! grep -q '^[1-9]' /out/switch-ns.txt; then
  echo "guest: perf bench sched pipe gave no time"
  exit 1
fi
# perf stops sampling a CPU that took more samples than one tick allows ("throttled") until a
# later tick: the kernel lowers that limit when its sampling interrupt runs long (as it does
# under emulation), and on an idle CPU whose tick is stopped the count of samples never resets,
# so it throttles there after max_sample_rate / HZ samples. Keep the limit where it is (it
# stays 400 a tick at 250 Hz: 40 ms of a tickless idle CPU at 10,000 Hz).
echo 0 >/proc/sys/kernel/perf_cpu_time_max_percent
for b in $BACKENDS; do
  for f in ${FREQS:-4000}; do
    r="$b-$f"
    echo "guest: record --attach $b, perf record -a -F $f"
    memcg-trace record --attach "$b" $PROBES -q -o "/out/profile-$r.json" -- sh -c "sleep 3; exec hackbench $HB" \
      >"/out/profile-$r.txt" 2>"/out/profile-$r.err" &
    mt=$!
    perf record -a -e cpu-clock -F "$f" -g -o "/tmp/perf-$r.data" \
      >/dev/null 2>"/out/perf-record-$r.err" &
    perf=$!
    if ! wait $mt; then
      cat "/out/profile-$r.err" "/out/profile-$r.txt"
      exit 1
    fi
    kill -INT $perf
    wait $perf || true  # perf ends on the SIGINT with 130
    # The functions traced, by the summary's footnotes ("NAME TARGET via ...").
    targets=$(awk '$3 == "via" { printf "%s%s", sep, $2; sep = "," }' "/out/profile-$r.txt")
    # When a throttled CPU's sampling resumes ("CPU TIME OFFSET [SIZE]: PERF_RECORD_UNTHROTTLE:"
    # in the raw dump): the stretch before it was not watched, and the first sample after it
    # weighs only the time since. Throttling happens on idle CPUs whose tick is stopped; the
    # running time between a wake-up there and the next tick (at most a tick, 4 ms at 250 Hz)
    # is then unwatched too: 0.3% of the workload's CPU time in the runs seen. The dump must
    # hold the samples, or its throttle records could be missing unseen.
    perf report -D -i "/tmp/perf-$r.data" 2>"/out/perf-report-$r.err" |
      awk -v count="/tmp/dumped-$r.txt" '
        $5 == "PERF_RECORD_UNTHROTTLE:" { print $1, $2 }
        index($5, "PERF_RECORD_SAMPLE") == 1 { dumped++ }
        END { print dumped + 0 >count }
      ' | sort -k1,1n -k2,2n >"/tmp/unthrottle-$r.txt"
    if ! grep -q '^[1-9]' "/tmp/dumped-$r.txt"; then
      echo "guest: perf report -D gave no sample"
      cat "/out/perf-report-$r.err"
      exit 1
    fi
    perf script -i "/tmp/perf-$r.data" --ns -F comm,cpu,time,ip,sym 2>"/out/perf-script-$r.err" | awk -v targets="$targets" -v unthrottle="/tmp/unthrottle-$r.txt" '
      # A frame of the instrumentation: a BPF program or trampoline (unnamed kernel text is
      # JIT code here), or the ftrace, kprobe and return-probe machinery that runs the programs
      # (the ftrace trampoline a kprobe enters by is its own frame above the function).
      function instr(s) {
        return s ~ /^bpf_prog_/ || s ~ /^bpf_trampoline_/ || s == "[unknown]" ||
          s ~ /^(ftrace_trampoline|ftrace_regs_caller|ftrace_caller|ftrace_regs_call|ftrace_call|ftrace_stub|arch_ftrace_ops_list_func|ftrace_ops_list_func|kprobe_ftrace_handler|kprobe_dispatcher|kretprobe_dispatcher|kprobe_perf_func|kretprobe_perf_func|trace_call_bpf|arch_rethook_trampoline|arch_rethook_trampoline_callback|rethook_trampoline_handler|kretprobe_rethook_handler|__kretprobe_trampoline|kretprobe_trampoline)$/
      }
      BEGIN {
        n = split(targets, t, ","); for (i = 1; i <= n; i++) want[t[i]] = 1
        # Per CPU, the times its sampling resumed, in order.
        while ((getline line < unthrottle) > 0) {
          # The time a number (busybox awk compares strings from split as strings).
          split(line, u, " "); resumed[u[1], ++resumes[u[1]]] = u[2] + 0
        }
      }
      function done_sample() {
        if (mine) {
          # Batches of 400 consecutive samples: a sampler whose ticks fall in step with the
          # workload (the guest clock counts instructions) varies more than independent
          # samples would; the batches show how much.
          bi = int(total / 400); batches = bi + 1
          batch_ns[bi] += w
          if (!ins && hit != "") batch_self_ns[hit, bi] += w
          total++; total_ns += w
          total_ns2 += w * w
          if (ins) { instrumentation++; instrumentation_ns += w }
          else {
            if (hit != "") { self[hit]++; self_ns[hit] += w }
            for (k in seen) { incl[k]++; incl_ns[k] += w }
          }
        }
        mine = 0; hit = ""; ins = 0; split("", seen)
      }
      /^[ \t]*$/ { done_sample(); next }
      # A sample: "COMM [CPU] SECONDS:", then its callchain, innermost first.
      $0 !~ /^\t/ && match($0, /\[[0-9]+\] +[0-9]+\.[0-9]+:/) {
        done_sample()
        split(substr($0, RSTART, RLENGTH), h, /[] :[]+/)
        # The CPU as the raw dump writes it (no leading zeros), and the time in whole ns
        # ("SECONDS.NANOS"), exact, as there. Zero-padded digits are never taken as a number
        # (busybox awk reads them as octal).
        cpu = h[2]; sub(/^0+/, "", cpu); if (cpu == "") cpu = "0"
        split(h[3], secs, "."); now = secs[1] * 1000000000 + ("1" secs[2]) - 1000000000
        w = (cpu in last) ? now - last[cpu] : 0
        # The last time sampling resumed on this CPU before this sample: the stretch from
        # the previous sample to it was not watched.
        at = 0
        while (next_resume[cpu] < resumes[cpu] && resumed[cpu, next_resume[cpu] + 1] <= now)
          at = resumed[cpu, ++next_resume[cpu]]
        if ((cpu in last) && at > last[cpu]) {
          unwatched++; unwatched_ns += at - last[cpu]
          w = now - at
        }
        last[cpu] = now
        mine = $1 == "hackbench"
        next
      }
      {
        s = $2; sub(/\+0x[0-9a-f]+$/, "", s)
        # User-space frames end the kernel chain.
        if ($1 !~ /^ffff/) next
        # Innermost first: instrumentation reached before any traced function.
        if (hit == "" && !ins && instr(s)) ins = 1
        if (s in want) { if (hit == "") hit = s; seen[s] = 1 }
      }
      END {
        done_sample()
        printf "samples %d %.0f %.0f\n", total, total_ns, total_ns2
        printf "instrumentation %d %.0f\n", instrumentation, instrumentation_ns
        # Stretches of any task on any CPU that perf did not watch (throttled), and their ns.
        printf "throttled %d %.0f\n", unwatched, unwatched_ns
        for (i = 1; i <= n; i++)
          printf "%s %d %d %.0f %.0f\n", t[i], self[t[i]], incl[t[i]], self_ns[t[i]], incl_ns[t[i]]
        # Per batch of 400 samples (the last one partial): "batch INDEX NS FUNCTION SELF_NS ...".
        for (k = 0; k < batches; k++) {
          printf "batch %d %.0f", k, batch_ns[k]
          for (i = 1; i <= n; i++) printf " %s %.0f", t[i], batch_self_ns[t[i], k]
          printf "\n"
        }
      }
    ' >"/out/perf-shares-$r.txt"
    rm -f "/tmp/perf-$r.data" "/tmp/unthrottle-$r.txt" "/tmp/dumped-$r.txt"
    if ! grep -q '^samples [1-9]' "/out/perf-shares-$r.txt"; then
      echo "guest: perf took no sample of the workload"
      cat "/out/perf-record-$r.err" "/out/perf-script-$r.err"
      exit 1
    fi
    grep -v '^batch ' "/out/perf-shares-$r.txt"
  done
done
# The same recording without perf, $ALONE_ROUNDS rounds with the backends taking turns
# (`alone-$b-$i.json`): perf's sampling interrupts land inside the timed windows (in proportion
# to their time), which the floor, measured without them, does not take out. Rounds, because
# one run's time per call moves with the paths the workload takes through the function (the
# stock's refills) by a few ns from run to run; the test compares the backends' medians.
for i in $(seq 1 "${ALONE_ROUNDS:-1}"); do
  for b in $BACKENDS; do
    echo "guest: record --attach $b without perf, round $i"
    if ! memcg-trace record --attach "$b" $PROBES -q -o "/out/alone-$b-$i.json" -- sh -c "exec hackbench $HB" \
      >"/out/alone-$b-$i.txt" 2>"/out/alone-$b-$i.err"; then
      cat "/out/alone-$b-$i.err" "/out/alone-$b-$i.txt"
      exit 1
    fi
  done
done
