# Guest part of `cargo xtask bench`'s peer comparison, one boot per round: round ROUND of the
# same hackbench (PEER_HACKBENCH) untraced (U), under a typical bpftrace latency script (B),
# under memcg-trace with fentry (F) and kprobe (K), and under empty fentry/fexit programs on the
# same functions (E, the floor of any such tracer); then the leanest C peer on charge's function
# alone: libbpf-tools' funclatency (L) against memcg-trace `-p charge` with fentry (C) and
# kprobe (Q); the order rotated per round; and/or (CAL=1) the calibration, with bpf stats on
# for every tool, after the round if there is one. Set by the caller: ROUND (0: none), CAL,
# PEER_HACKBENCH, PROBES.
# Leaves in /out: peer-<round>-<variant>.txt (hackbench's output), peer-<round>-B.bt
# (bpftrace's), peer-<round>-L.fl (funclatency's), peer-<round>-<F|K|C|Q>.json, peer.bt,
# charge-func.txt, and cal-B.json / cal-L.json / cal-F.json / cal-K.json / cal-C.json /
# cal-Q.json.
#
# The functions memcg-trace resolves PROBES to on this kernel; bpftrace traces the same ones the
# way a linux-mm user would write it: start time keyed by tid, hist() of the difference.
echo "$PEER_HACKBENCH" >/out/hackbench-args.txt
memcg-trace probes -p "$PROBES" --attach fentry >/out/probes.txt
funcs=$(awk '$4 == "attached" {print $2}' /out/probes.txt)
[ -n "$funcs" ] || { echo "guest: no function to compare on"; cat /out/probes.txt; exit 1; }
i=0
: >/out/peer.bt
for f in $funcs; do
  i=$((i + 1))
  cat >>/out/peer.bt <<BT
kfunc:$f { @start$i[tid] = nsecs; }
kretfunc:$f /@start$i[tid]/ { @ns$i = hist(nsecs - @start$i[tid]); delete(@start$i[tid]); }
BT
done
echo "guest: bpftrace script:"
cat /out/peer.bt
# charge's function, the one funclatency times (it takes one function).
cfunc=$(memcg-trace probes -p charge --attach fentry | awk '$4 == "attached" {print $2}')
[ -n "$cfunc" ] || { echo "guest: charge has no function here"; exit 1; }
echo "$cfunc" >/out/charge-func.txt
# The floor any fentry/fexit tracer pays on these functions: the same probes, empty bodies.
sed 's/{.*}/{ }/; s|/@start[0-9]*\[tid\]/ ||' /out/peer.bt >/out/empty.bt
# memcg-trace runs its workload in a fresh memcg; the untraced and bpftrace runs get one too,
# else their hackbench would not charge at all (the root memcg is not charged) and the rounds
# would compare different work.
echo +memory >/sys/fs/cgroup/cgroup.subtree_control
mkdir -p /sys/fs/cgroup/peer
# A step that fails or hangs (15 minutes) ends the run with a line saying which, rather than
# leaving the VM to its timeout.
in_memcg() {
  timeout 900 sh -c 'echo $$ >/sys/fs/cgroup/peer/cgroup.procs && exec "$@"' sh "$@" ||
    { echo "guest: '$*' failed or hung (exit $?)" >&2; exit 1; }
}
# bpftrace under emulation takes a while to compile and attach: wait for its banner.
bpftrace_start() { # log [script]
  bpftrace "${2:-/out/peer.bt}" >"$1" 2>&1 &
  bp=$!
  n=0
  while ! grep -q Attaching "$1" 2>/dev/null; do
    if ! kill -0 $bp 2>/dev/null || [ $n -ge 3000 ]; then
      echo "guest: bpftrace did not attach"
      cat "$1"
      exit 1
    fi
    sleep 0.1
    n=$((n + 1))
    [ $((n % 300)) = 0 ] && echo "guest: still waiting for bpftrace to attach ($((n / 10)) s)"
  done
  # "Attaching N probes..." is printed before the last one is attached.
  sleep 2
}
# The round's figure (hackbench's time) is taken by then: a bpftrace that does not leave after
# SIGINT (seen twice in about twenty runs under TCG, in the empty-program round, the guest idle
# meanwhile) is killed and noted in /out/peer-hangs.txt; only one that survives SIGKILL too
# (its programs possibly still attached, which would skew later rounds) ends the run.
bpftrace_stop() {
  kill -INT $bp
  n=0
  while kill -0 $bp 2>/dev/null; do
    if [ $n = 1200 ]; then
      echo "guest: bpftrace still running 120 s after SIGINT: SIGKILL"
      echo "$1" >>/out/peer-hangs.txt
      kill -KILL $bp
    fi
    if [ $n -ge 2400 ]; then
      echo "guest: bpftrace still running 120 s after SIGKILL"
      exit 1
    fi
    sleep 0.1
    n=$((n + 1))
  done
  wait $bp || true
}
# funclatency's "Tracing ..." line may wait in its stdout buffer until it leaves: it is
# attached once its two programs (dummy_kprobe and dummy_kretprobe in 0.26, dummy_fentry and
# dummy_fexit where it takes fentry) are loaded and a moment has passed.
funclatency_start() { # log
  funclatency "$cfunc" >"$1" 2>&1 &
  fl=$!
  n=0
  while [ "$(memcg-trace programs --name dummy_ --json | grep -c '"id"')" -lt 2 ]; do
    if ! kill -0 $fl 2>/dev/null || [ $n -ge 600 ]; then
      echo "guest: funclatency did not attach"
      cat "$1"
      exit 1
    fi
    sleep 0.5
    n=$((n + 1))
  done
  sleep 2
  kill -0 $fl 2>/dev/null || { echo "guest: funclatency ended:"; cat "$1"; exit 1; }
}
funclatency_stop() {
  kill -INT $fl 2>/dev/null || true
  n=0
  while kill -0 $fl 2>/dev/null; do
    if [ $n = 1200 ]; then
      echo "guest: funclatency still running 120 s after SIGINT: SIGKILL"
      kill -KILL $fl
    fi
    if [ $n -ge 2400 ]; then
      echo "guest: funclatency still running 120 s after SIGKILL"
      exit 1
    fi
    sleep 0.1
    n=$((n + 1))
  done
  wait $fl || true
}
run() { # round variant
  case $2 in
  U) in_memcg hackbench $PEER_HACKBENCH >/out/peer-$1-U.txt ;;
  E)
    bpftrace_start /out/peer-$1-E.bt /out/empty.bt
    in_memcg hackbench $PEER_HACKBENCH >/out/peer-$1-E.txt
    bpftrace_stop "round $1: E"
    ;;
  B)
    bpftrace_start /out/peer-$1-B.bt
    in_memcg hackbench $PEER_HACKBENCH >/out/peer-$1-B.txt
    bpftrace_stop "round $1: B"
    ;;
  L)
    funclatency_start /out/peer-$1-L.fl
    in_memcg hackbench $PEER_HACKBENCH >/out/peer-$1-L.txt
    funclatency_stop
    ;;
  F | K | C | Q)
    backend=fentry
    case $2 in K | Q) backend=kprobe ;; esac
    probes=$PROBES
    case $2 in C | Q) probes=charge ;; esac
    timeout 900 memcg-trace record -q --attach $backend -p "$probes" -o /out/peer-$1-$2.json \
      -- hackbench $PEER_HACKBENCH >/out/peer-$1-$2.txt 2>/out/peer-$1-$2.err ||
      { echo "guest: round $1: $2 failed or hung (exit $?)"; cat /out/peer-$1-$2.err; exit 1; }
    ;;
  esac
}
r=$ROUND
if [ "$r" -gt 0 ]; then
  # Round r starts at the ((r - 1) mod 8)-th variant (with 7 rounds, Q never starts one).
  order="U B F K E L C Q"
  i=1
  while [ $i -lt $(((r - 1) % 8 + 1)) ]; do
    order="${order#* } ${order%% *}"
    i=$((i + 1))
  done
  for v in $order; do
    echo "guest: round $r: $v"
    run $r $v
  done
fi
[ "$CAL" = 1 ] || exit 0
# Calibration: both tools' programs with the kernel's stats on (which add two clock reads to
# every run, so these times are not the rounds' costs; they compare the programs).
echo 1 >/proc/sys/kernel/bpf_stats_enabled
echo "guest: calibration: bpftrace"
bpftrace_start /out/cal-B.bt
in_memcg hackbench $PEER_HACKBENCH >/out/cal-B.txt
memcg-trace programs --json >/out/cal-B.json
bpftrace_stop "calibration: B"
echo "guest: calibration: funclatency"
funclatency_start /out/cal-L.fl
in_memcg hackbench $PEER_HACKBENCH >/out/cal-L.txt
memcg-trace programs --json >/out/cal-L.json
funclatency_stop
for v in F K C Q; do
  echo "guest: calibration: $v"
  backend=fentry
  case $v in K | Q) backend=kprobe ;; esac
  probes=$PROBES
  case $v in C | Q) probes=charge ;; esac
  memcg-trace record -q --bpf-stats --attach $backend -p "$probes" -o /out/cal-$v.json \
    -- hackbench $PEER_HACKBENCH >/out/cal-$v.txt 2>/out/cal-$v.err
done
echo 0 >/proc/sys/kernel/bpf_stats_enabled
