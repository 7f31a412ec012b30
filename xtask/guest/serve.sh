# Guest script of the serve test: `memcg-trace serve` with a workload, one scrape of /metrics
# after the workload exited (its rows final), then SIGTERM, which writes the recording of
# the same run (-o) for the host to compare the two.
ifconfig lo 127.0.0.1 up
memcg-trace serve --callers --listen 127.0.0.1:9464 -o /out/serve.json -- hackbench -g 1 -l 100 \
  >/out/serve.txt 2>/out/serve.err &
sp=$!
n=0
until grep -q "workload exited" /out/serve.err; do
  if [ $n -ge 1800 ] || ! kill -0 $sp 2>/dev/null; then
    echo "guest: serve's workload did not end (or serve did)"
    cat /out/serve.err
    exit 1
  fi
  sleep 0.5
  n=$((n + 1))
done
wget -q -O /out/metrics.txt http://127.0.0.1:9464/metrics ||
  { echo "guest: no answer on /metrics"; cat /out/serve.err; exit 1; }
kill -TERM $sp
rc=0
wait $sp || rc=$?
echo "guest: serve exited $rc"
cat /out/serve.err
[ "$rc" = 0 ]
