# Guest script of the call-site test: the default probes with --callers, with fentry and with
# kprobe, while hackbench runs in a fresh memcg; the kernel's symbols go back with the
# recordings, for the host to check every site against them.
for b in fentry kprobe; do
  echo "guest: record --attach $b --callers -- hackbench -g 1 -l 50"
  if ! memcg-trace record --attach "$b" --callers -q -o "/out/callers-$b.json" -- hackbench -g 1 -l 50 \
    >"/out/callers-$b.txt" 2>"/out/callers-$b.err"; then
    echo "guest: record --attach $b --callers failed:"
    cat "/out/callers-$b.err" "/out/callers-$b.txt"
    exit 1
  fi
  cat "/out/callers-$b.txt"
done
grep -i ' t ' /proc/kallsyms >/out/kallsyms-text
# Short stacks, every entry's (one in one): who called the callers.
for b in fentry kprobe; do
  echo "guest: record --attach $b --callers --callers-depth 4 --callers-sample 1 -- hackbench -g 1 -l 30"
  if ! memcg-trace record --attach "$b" --callers --callers-depth 4 --callers-sample 1 -q \
    -o "/out/stacks-$b.json" -- hackbench -g 1 -l 30 >"/out/stacks-$b.txt" 2>"/out/stacks-$b.err"; then
    echo "guest: record --attach $b --callers-depth failed:"
    cat "/out/stacks-$b.err" "/out/stacks-$b.txt"
    exit 1
  fi
  cat "/out/stacks-$b.txt"
done
