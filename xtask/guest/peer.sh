# Guest part of `cargo xtask bench`: rounds of untraced / bpftrace / memcg-trace (fentry) /
# memcg-trace (kprobe) runs of the same hackbench, order rotated per round. ROUNDS and
# PEER_HACKBENCH are set by the caller. Leaves peer-<round>-<variant>.txt (hackbench's output),
# peer-<round>-<F|K>.json and peer.bt in /out.
# The functions memcg-trace resolves the default probes to on this kernel; bpftrace traces the
# same ones with a typical latency script: start time keyed by tid, hist() of the difference.
memcg-trace probes -p charge,stat,rstat --attach fentry >/out/probes.txt
funcs=$(awk '$4 == "attached" {print $2}' /out/probes.txt)
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
run() { # round variant
  case $2 in
  U) hackbench $PEER_HACKBENCH >/out/peer-$1-U.txt ;;
  B)
    bpftrace /out/peer.bt >/out/peer-$1-B.bt 2>&1 &
    bp=$!
    n=0
    while ! grep -q Attaching /out/peer-$1-B.bt 2>/dev/null && [ $n -lt 1200 ]; do sleep 0.1; n=$((n + 1)); done
    sleep 1
    hackbench $PEER_HACKBENCH >/out/peer-$1-B.txt
    kill -INT $bp
    wait $bp
    ;;
  F) memcg-trace record --attach fentry -q -o /out/peer-$1-F.json -- hackbench $PEER_HACKBENCH >/out/peer-$1-F.txt 2>/out/peer-$1-F.err ;;
  K) memcg-trace record --attach kprobe -q -o /out/peer-$1-K.json -- hackbench $PEER_HACKBENCH >/out/peer-$1-K.txt 2>/out/peer-$1-K.err ;;
  esac
}
r=1
while [ $r -le $ROUNDS ]; do
  case $((r % 4)) in
  1) order="U B F K" ;;
  2) order="B F K U" ;;
  3) order="F K U B" ;;
  0) order="K U B F" ;;
  esac
  for v in $order; do
    echo "guest: round $r: $v"
    run $r $v
  done
  r=$((r + 1))
done
