# Guest script of xtask/jit-profile.py: one recording of probe PROBE with backend ATTACH (and
# FLAGS) around a short hackbench, the BPF symbols of its programs while they are loaded, and
# the recording (whose call count divides QEMU's instruction counts). With HELPERS=1 also the
# kernel's text symbols (the guest boots with nokaslr: the same addresses every boot) and its
# clocksource, so that the functions the programs call can be followed.
if [ "${HELPERS:-0}" = 1 ]; then
  grep -iE " (t|w) " /proc/kallsyms >/out/kernel-symbols.txt
  cat /sys/devices/system/clocksource/clocksource0/current_clocksource >/out/clocksource.txt
fi
memcg-trace record --attach "$ATTACH" $FLAGS -p "$PROBE" -q -o /out/profiled.json -- \
  sh -c 'grep "\[bpf\]" /proc/kallsyms >/out/bpf-symbols.txt; hackbench -g 1 -l 20' \
  >/out/profiled.txt 2>&1 || { cat /out/profiled.txt; exit 1; }
