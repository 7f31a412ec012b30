# Guest script of `cargo xtask bench`: BACKENDS, PAIRS, REPEATS, HACKBENCH and DAEMON_HACKBENCH
# are set by the caller. Leaves bench-<backend>.json and daemon-<tick>.json in /out.
for b in $BACKENDS; do
  echo "guest: bench --attach $b --pairs $PAIRS -- hackbench $HACKBENCH"
  memcg-trace bench --attach "$b" --pairs "$PAIRS" --repeats "$REPEATS" -o "/out/bench-$b.json" -- hackbench $HACKBENCH >/dev/null
done
for t in 1s 100ms; do
  echo "guest: record --tick $t -- hackbench $DAEMON_HACKBENCH"
  memcg-trace record -q --tick "$t" -o "/out/daemon-$t.json" -- hackbench $DAEMON_HACKBENCH >/dev/null
done
