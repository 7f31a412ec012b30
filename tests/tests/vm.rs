//! The VM kernel matrix: the real binary inside Debian's stock kernels under qemu, recording
//! the default probes with fentry and with kprobe while hackbench runs in a fresh memcg.
//! Each test boots one kernel; `MEMCG_TRACE_KERNELS` (default: the whole matrix) picks which run
//! and the others print a skip.

use std::{collections::BTreeSet, fmt::Write as _, fs, path::Path, time::Duration};

use memcg_trace_tests::callgraph::Link;

use memcg_trace_tests::*;
use xtask::{
    kernels,
    vm::{self, Accel, VmSpec},
};

const DEFAULT_PROBES: [&str; 3] = ["charge", "stat", "rstat"];

/// New keys of the map-update workload (vm_matrix on 6.1 and 6.12): each is a charge made
/// where no kprobe program may run.
const UPDATES: u64 = 2000;

fn accel() -> Accel {
    match std::env::var("MEMCG_TRACE_ACCEL").as_deref() {
        Ok("kvm") => Accel::Kvm,
        _ => Accel::Tcg,
    }
}

fn vm_matrix(short: &str) {
    let name = format!("vm_matrix_{}", short.replace(['.', '-'], "_"));
    let vm_name = name.as_str();
    let wanted =
        std::env::var("MEMCG_TRACE_KERNELS").unwrap_or_else(|_| kernels::test_matrix().join(","));
    if !wanted.split(',').any(|k| k.trim() == short) {
        skip(
            &name,
            &format!("kernel {short} not in MEMCG_TRACE_KERNELS={wanted}"),
        );
        return;
    }
    if !is_root() {
        skip(&name, "needs root (apt-get download of the kernel)");
        return;
    }
    let accel = accel();
    let spec = kernels::select(short).expect("known kernel")[0];
    let kernel = kernels::fetch(spec).unwrap_or_else(|e| panic!("fetch kernel {short}: {e:#}"));
    let legacy = short == "5.10";
    let arch = spec.arch;
    let arm64 = arch == kernels::Arch::Arm64;
    let mut script = xtask::record_script("auto fentry kprobe", "-g 2 -l 100", true);
    if legacy {
        // No source of per-CPU offsets: 5.10's BTF has no per-CPU section, and kallsyms hides
        // its addresses from root too with kptr_restrict 2. The tracer must still trace.
        script.push_str(
            "echo 2 >/proc/sys/kernel/kptr_restrict\n\
             memcg-trace record -q -o /out/nosplit.json -- hackbench -g 2 -l 20 >/out/nosplit.txt 2>/out/nosplit.err || { cat /out/nosplit.err; exit 1; }\n\
             echo 0 >/proc/sys/kernel/kptr_restrict\n",
        );
    }
    // x86: the kernel's list of kprobes while memcg-trace's are attached, read by the check
    // that refuses a kprobe off its ftrace site (int3 runs it in NMI context): it must find
    // memcg-trace's kprobes in it, on ftrace.
    if !arm64 {
        script.push_str(
            "memcg-trace record --attach kprobe -q -p charge -o /out/klist.json -- sh -c 'cat /sys/kernel/debug/kprobes/list >/out/kprobes-list.txt; hackbench -g 1 -l 5' >/out/klist.txt 2>&1 || { cat /out/klist.txt; exit 1; }\n",
        );
    }
    // A workload that makes a cgroup below its own and moves into it (as systemd-run --scope
    // and container runtimes do): its CPU time stays in its cgroup's cpu.stat, so its calls
    // must stay the workload's. 5.10 runs the legacy object, which reads the cgroup's
    // `ancestor_ids[]` itself (its kernel refuses the ancestor helper to tracing programs).
    let moved = matches!(short, "5.10" | "6.12" | "7.3");
    // The workload beside another charger: a hackbench pair (one sender, one receiver) in a
    // memcg of its own (the root cgroup's tasks charge nothing) that outlasts the recording. The workload's row must hold
    // the workload's calls only, as many as it makes alone, with the other's calls in the
    // system rows: a strict gap, which counting every task call as the workload's would close.
    if moved {
        script.push_str(
            "memcg-trace record -q -p charge -o /out/alone.json -- hackbench -g 1 -l 40 >/out/alone.txt 2>&1 || { cat /out/alone.txt; exit 1; }\n\
             echo +memory >/sys/fs/cgroup/cgroup.subtree_control; mkdir /sys/fs/cgroup/other\n\
             sh -c 'echo $$ >/sys/fs/cgroup/other/cgroup.procs && exec hackbench -g 1 -f 1 -l 100000000' >/dev/null 2>&1 &\n\
             sleep 1\n\
             memcg-trace record -q -p charge -o /out/beside.json -- hackbench -g 1 -l 40 >/out/beside.txt 2>&1 || { cat /out/beside.txt; exit 1; }\n\
             o=/sys/fs/cgroup/other; if [ -e $o/cgroup.kill ]; then echo 1 >$o/cgroup.kill; else while [ -n \"$(cat $o/cgroup.procs)\" ]; do kill -9 $(cat $o/cgroup.procs) 2>/dev/null; sleep 0.1; done; fi; wait || true\n\
             rmdir /sys/fs/cgroup/other 2>/dev/null || true\n",
        );
        script.push_str(
            "memcg-trace record -q -p charge -o /out/moved.json -- sh -c 'cg=/sys/fs/cgroup$(cut -d: -f3 /proc/self/cgroup); mkdir $cg/in && echo $$ >$cg/in/cgroup.procs && exec hackbench -g 2 -l 50' >/out/moved.txt 2>&1 || { cat /out/moved.txt; exit 1; }\n",
        );
    }
    // Every probe (`--all`): no function traced twice. On 7.3 `charge` resolves to the slab
    // hook, which is `slab_post_alloc` too: that one is refused, saying where its calls are.
    // (6.12 for a kernel where all are distinct.)
    let all = matches!(short, "6.12" | "7.3");
    if all {
        script.push_str(
            "memcg-trace record --all -q -o /out/all.json -- hackbench -g 1 -l 10 >/out/all.txt 2>&1 || { cat /out/all.txt; exit 1; }\n",
        );
    }
    // A dynamic kernel's preemption model changed while the programs run, and changed back
    // before the end: the recording says it, and keeps the model they were set for.
    if short == "7.3" {
        script.push_str(
            "memcg-trace record -q -p stat --tick 100ms -o /out/repreempt.json -- sh -c 'echo full >/sys/kernel/debug/sched/preempt && hackbench -g 1 -l 10 && sleep 0.5; echo lazy >/sys/kernel/debug/sched/preempt' >/out/repreempt.txt 2>&1 || { cat /out/repreempt.txt; exit 1; }\n",
        );
        // Changed and changed back at once, well inside a tick: no tick can see it.
        script.push_str(
            "memcg-trace record -q -p stat -o /out/flicker.json -- sh -c 'echo full >/sys/kernel/debug/sched/preempt; echo lazy >/sys/kernel/debug/sched/preempt; hackbench -g 1 -l 10' >/out/flicker.txt 2>&1 || { cat /out/flicker.txt; exit 1; }\n",
        );
    }
    // Charges made inside a BPF map update system call, where the kernel holds the CPU's
    // bpf_prog_active: no kprobe program runs for them. Before 6.7 the kernel counts such
    // runs nowhere (memcg-trace's "kprobe hits not run" must: the kprobe's hits less the runs
    // its programs counted); from 6.7 as the programs' misses. The workload makes an LPM trie
    // (its nodes are allocated and charged to the map's memcg, the workload's, at each new
    // key) and inserts UPDATES keys in one bpftool process.
    let skips = matches!(short, "6.1" | "6.12");
    if skips {
        script.push_str(&format!(
            "i=0; : >/tmp/updates\n\
             while [ $i -lt {UPDATES} ]; do echo \"map update pinned /sys/fs/bpf/mt_trie key 32 0 0 0 10 $((i / 256)) $((i % 256)) 0 value 0 0 0 0 0 0 0 0\" >>/tmp/updates; i=$((i + 1)); done\n\
             memcg-trace record --attach kprobe -q -p charge -o /out/skipped.json -- sh -c '/usr/sbin/bpftool map create /sys/fs/bpf/mt_trie type lpm_trie key 8 value 8 entries {UPDATES} name mt_trie flags 1 && /usr/sbin/bpftool batch file /tmp/updates >/dev/null' >/out/skipped.txt 2>&1 || {{ cat /out/skipped.txt; exit 1; }}\n\
             rm -f /sys/fs/bpf/mt_trie\n"
        ));
    }
    // PREEMPT_RT: softirqs run in tasks and are counted in the task (`softirq_disable_cnt`),
    // not in preempt_count. A loopback TCP stream in the workload's memcg charges its socket
    // memory in NET_RX, which the sending task serves as it re-enables bottom halves; bpftrace,
    // beside the recording, counts the stat function's calls by that task field (the kernel's
    // own `in_serving_softirq()` there).
    let rt = short.ends_with("-rt");
    if rt {
        script.push_str(RT_SOCKETS);
    }
    // Before 6.7 on a preemptible kernel the deferred pairs of a kprobe are proven by the
    // switch witness. A bpftool process inserting keys again and again, pinned to CPU 0, is
    // preempted inside its map system calls, where the kernel holds CPU 0's bpf_prog_active:
    // every kprobe program on that CPU is skipped meanwhile, hackbench's too. What preempts it
    // there is cyclictest's real-time thread, woken every 200 us on CPU 0: a busy loop beside
    // it, preempting it once a time slice, found it inside a section in some runs only (64
    // and 778 held switches, and 0 in one run of three). hackbench runs on CPU 0 too: its
    // calls that left the CPU while a section was held there cannot be proven on their CPU
    // (elsewhere they were, all but the migrated ones: 844 of 863, none rejected). It starts
    // once the bpftool loop has, and the loop makes at least one round and stops only after
    // hackbench ended (a loop that tested first, starved on CPU 0 by a busy loop and
    // hackbench, once made no round at all).
    let witness = short == "6.1-rt";
    if witness {
        script.push_str(&format!("i=0; : >/tmp/updates\n\
             while [ $i -lt {UPDATES} ]; do echo \"map update pinned /sys/fs/bpf/mt_trie key 32 0 0 0 10 $((i / 256)) $((i % 256)) 0 value 0 0 0 0 0 0 0 0\" >>/tmp/updates; i=$((i + 1)); done\n\
             /usr/sbin/bpftool map create /sys/fs/bpf/mt_trie type lpm_trie key 8 value 8 entries {UPDATES} name mt_trie flags 1\n\
             echo \"guest: bpftool preempted in its map updates\"\n\
             cyclictest -q -m -a 0 -t 1 -p 90 -i 200 >/dev/null 2>&1 & cyc=$!\n\
             memcg-trace record --attach kprobe -q -p charge -o /out/witness.json -- sh -c 'rm -f /tmp/hb-done /tmp/bt-started; taskset -c 0 sh -c \"touch /tmp/bt-started; while :; do /usr/sbin/bpftool batch file /tmp/updates >/dev/null || exit 1; [ -e /tmp/hb-done ] && exit 0; done\" & u=$!; while [ ! -e /tmp/bt-started ]; do sleep 0.05; done; taskset -c 0 hackbench -g 2 -l 100; touch /tmp/hb-done; wait $u' >/out/witness.txt 2>&1 || {{ kill $cyc; cat /out/witness.txt; exit 1; }}\n\
             kill $cyc\n\
             rm -f /sys/fs/bpf/mt_trie\n"
        ));
    }
    if short == "arm64-6.12" {
        // kallsyms' addresses hidden from root too: arm64's per-CPU offset (from
        // __per_cpu_start) is then unknown, and the recording must say how fentry's interrupt
        // pairs are decided instead.
        script.push_str(
            "echo 2 >/proc/sys/kernel/kptr_restrict\n\
             memcg-trace record --attach fentry -q -p rstat -o /out/hidden.json -- hackbench -g 1 -l 10 >/out/hidden.txt 2>/out/hidden.err || { cat /out/hidden.err; exit 1; }\n\
             echo 0 >/proc/sys/kernel/kptr_restrict\n",
        );
    }
    let r = vm::run(
        &kernel,
        &VmSpec {
            name: format!("{short}-test"),
            script,
            bins: [
                bin_for(arch),
                memcg_trace::workload::hackbench().expect("hackbench (rt-tests)"),
            ]
            .into_iter()
            .chain(rt.then(|| xtask::which("bpftrace").expect("bpftrace (cargo xtask setup)")))
            .chain(witness.then(|| xtask::which("cyclictest").expect("cyclictest (rt-tests)")))
            .collect(),
            accel,
            timeout: Duration::from_secs(900),
            echo: false,
            modules: Vec::new(),
            // bpftrace brings LLVM: ~200 MB of libraries in the initramfs.
            mem_mb: if rt { 2048 } else { 0 },
            cpus: 0,
            icount: None,
            packages: if skips || witness {
                ["bpftool", "libelf1", "libcap2", "zlib1g"]
                    .map(String::from)
                    .to_vec()
            } else {
                Vec::new()
            },
            files: Vec::new(),
            nmis: None,
        },
    )
    .expect("start the VM");
    assert!(
        r.success,
        "{short}: {}\n--- last console lines ({}) ---\n{}",
        r.failure.as_deref().unwrap_or(""),
        r.log.display(),
        r.tail(60)
    );
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        format!(
            "{name}: booted and ran in {:.1}s\n",
            r.elapsed.as_secs_f64()
        )
        .as_bytes(),
    );
    let selftest = fs::read_to_string(r.out_dir.join("selftest.txt")).expect("selftest output");
    check_selftest(&selftest);
    // Before 5.19 the legacy object is loaded (no migrated-call search) and the selftest
    // checks that such calls are left unmatched instead; before 5.11 the task is read through
    // bpf_probe_read_kernel (no bpf_get_current_task_btf), so the general programs are used.
    assert_eq!(
        selftest.contains("(legacy object: unmatched instead): ok"),
        legacy,
        "{short}: the selftest's migrated cases for the {} object",
        if legacy { "legacy" } else { "full" }
    );
    if legacy {
        check_no_context_split(&r.out_dir);
        // The portable release binary ran with the guest's own Debian 11 C library.
        let libc = fs::read_to_string(r.out_dir.join("libc.txt")).unwrap_or_default();
        assert!(
            libc.contains("version 2.31"),
            "{short}: the guest's C library is not Debian 11's 2.31: {libc:?}"
        );
    }
    if !arm64 {
        let doc = load_recording(&r.out_dir.join("klist.json"));
        let target = &doc.probes[0].target;
        let list = fs::read_to_string(r.out_dir.join("kprobes-list.txt")).unwrap_or_default();
        for ret in [false, true] {
            assert_eq!(
                memcg_trace::tracer::kprobe::off_ftrace(&list, target, ret),
                Some(false),
                "{short}: memcg-trace's {} on {target} is not found on its ftrace site in the kernel's list:\n{list}",
                if ret { "kretprobe" } else { "kprobe" }
            );
        }
    }
    if arm64 {
        check_arm64(&r, &selftest);
    }
    if short == "arm64-6.12" {
        let doc = load_recording(&r.out_dir.join("hidden.json"));
        let summary = fs::read_to_string(r.out_dir.join("hidden.txt")).expect("summary");
        check_invariants(&doc, &summary);
        assert!(
            doc.meta.calibration.iter().any(|c| {
                c.starts_with("fentry interrupt pairs confirmed per tick in userspace")
                    && c.contains("__per_cpu_start")
            }),
            "arm64 without __per_cpu_start: {:?}",
            doc.meta.calibration
        );
        assert!(
            probe(&doc, "rstat").count > 0,
            "arm64 hidden kallsyms: rstat"
        );
    }
    if all {
        let doc = load_recording(&r.out_dir.join("all.json"));
        let summary = fs::read_to_string(r.out_dir.join("all.txt")).expect("summary");
        check_invariants(&doc, &summary);
        let base = |t: &str| t.split('.').next().unwrap_or(t).to_string();
        let mut targets: Vec<String> = doc.probes.iter().map(|p| base(&p.target)).collect();
        targets.sort();
        let n = targets.len();
        targets.dedup();
        assert_eq!(
            targets.len(),
            n,
            "{short}: --all traces a function twice\n{summary}"
        );
        if short == "7.3" {
            assert_eq!(probe(&doc, "charge").target, "__memcg_slab_post_alloc_hook");
            let refused = doc
                .not_attached
                .iter()
                .find(|f| f.name == "slab_post_alloc")
                .unwrap_or_else(|| panic!("7.3: slab_post_alloc not refused\n{summary}"));
            assert!(
                refused
                    .reasons
                    .iter()
                    .any(|r| r.contains("already traced as charge")),
                "7.3: slab_post_alloc refused for {:?}",
                refused.reasons
            );
        }
        let _ = std::io::Write::write_all(
            &mut std::io::stderr(),
            format!(
                "{vm_name}: --all: {n} probes on distinct functions; not attached: {:?}\n",
                doc.not_attached.iter().map(|f| &f.name).collect::<Vec<_>>()
            )
            .as_bytes(),
        );
    }
    if moved {
        let doc = load_recording(&r.out_dir.join("moved.json"));
        let summary = fs::read_to_string(r.out_dir.join("moved.txt")).expect("summary");
        check_invariants(&doc, &summary);
        let p = probe(&doc, "charge");
        let own = p.workload.as_ref().expect("workload figures").count;
        let task_calls = ctx_count(p, "task");
        // hackbench makes nearly all task calls; before the workload's sub-cgroups were
        // followed, only the shell's few calls before its move were the workload's.
        assert!(
            own * 2 >= task_calls && own <= task_calls,
            "{short}: a workload in a cgroup below its own: workload {own} of {task_calls} task calls\n{summary}"
        );
        let _ = std::io::Write::write_all(
            &mut std::io::stderr(),
            format!("{vm_name}: moved workload: {own} of {task_calls} task calls\n").as_bytes(),
        );
        let alone = load_recording(&r.out_dir.join("alone.json"));
        let beside = load_recording(&r.out_dir.join("beside.json"));
        let summary = fs::read_to_string(r.out_dir.join("beside.txt")).expect("summary");
        check_invariants(&beside, &summary);
        let own_of = |d: &memcg_trace::export::Document| {
            let p = probe(d, "charge");
            (
                p.workload.as_ref().expect("workload figures").count,
                ctx_count(p, "task"),
            )
        };
        let (solo, _) = own_of(&alone);
        let (own, task_calls) = own_of(&beside);
        // hackbench -g 1 -l 40 charges about the same each run (the counts of -g 2 -l 100 are
        // equal to the call in every boot); the other hackbench, running all along, thousands.
        assert!(
            own.abs_diff(solo) * 20 <= solo && task_calls >= own + 1000,
            "{short}: beside another charger the workload's row has {own} calls ({solo} alone), of {task_calls} task calls\n{summary}"
        );
        let _ = std::io::Write::write_all(
            &mut std::io::stderr(),
            format!(
                "{vm_name}: beside another charger: workload {own} calls ({solo} alone), {} others' task calls\n",
                task_calls - own
            )
            .as_bytes(),
        );
    }
    if short == "7.3" {
        let doc = load_recording(&r.out_dir.join("repreempt.json"));
        let summary = fs::read_to_string(r.out_dir.join("repreempt.txt")).expect("summary");
        check_invariants(&doc, &summary);
        assert_eq!(
            doc.meta.preemption_model, "PREEMPT_DYNAMIC, running as lazy",
            "{short}: the model the programs were set for"
        );
        assert!(
            doc.meta
                .calibration
                .iter()
                .any(|c| c.contains("the preemption model changed while tracing")
                    && c.contains("ran as full")),
            "{short}: a preemption model changed mid-run is not told: {:?}\n{summary}",
            doc.meta.calibration
        );
        assert!(
            summary.contains("preemption model changed"),
            "{short}: the table does not say the model changed\n{summary}"
        );
        let doc = load_recording(&r.out_dir.join("flicker.json"));
        let summary = fs::read_to_string(r.out_dir.join("flicker.txt")).expect("summary");
        check_invariants(&doc, &summary);
        // (A tick that fell between the two writes would see the change itself.)
        assert!(
            doc.meta.calibration.iter().any(|c| c.contains(
                "the preemption model was written while tracing and runs as lazy again"
            ) || c.contains("the preemption model changed while tracing")),
            "{short}: a preemption model changed and changed back within a tick is not told: {:?}\n{summary}",
            doc.meta.calibration
        );
        assert!(
            summary.contains("preemption model was written")
                || summary.contains("preemption model changed"),
            "{short}: the table does not say the model was written\n{summary}"
        );
    }
    if skips {
        let doc = load_recording(&r.out_dir.join("skipped.json"));
        let summary = fs::read_to_string(r.out_dir.join("skipped.txt")).expect("summary");
        check_invariants(&doc, &summary);
        let p = probe(&doc, "charge");
        // Each key's node (and its branch's) is charged: about two calls a key, counted once
        // each (counting runs, entry and exit, made them four).
        assert!(
            p.kprobe_skipped >= UPDATES && p.kprobe_skipped <= 3 * UPDATES,
            "{short}: charges made inside map updates: {} kprobe hits not run, {UPDATES} keys inserted\n{summary}",
            p.kprobe_skipped
        );
        // From 6.7 the kernel counts them itself, as the programs' misses; before, only the
        // hits less the runs tell them.
        let kernel_counts = short != "6.1";
        assert_eq!(
            p.recursion_misses >= UPDATES,
            kernel_counts,
            "{short}: the programs' misses {} ({UPDATES} keys)\n{summary}",
            p.recursion_misses
        );
        if kernel_counts {
            // Two counts of the kernel's that do not share code: the kprobe events' hits less
            // the runs, and the programs' own misses.
            let fewer = p
                .programs
                .iter()
                .map(|g| g.recursion_misses)
                .min()
                .unwrap_or(0);
            // (A hit between a kprobe's arming and its program's attach counts as skipped.)
            assert!(
                p.kprobe_skipped.abs_diff(fewer) <= fewer / 100 + 10,
                "{short}: {} calls told by the kprobe hits, {fewer} by the programs' misses\n{summary}",
                p.kprobe_skipped
            );
        }
        assert!(
            p.lost_upper >= p.kprobe_skipped,
            "{short}: loss at most {} leaves out {} kprobe hits not run\n{summary}",
            p.lost_upper,
            p.kprobe_skipped
        );
        assert_eq!(
            summary.contains("calls whose kprobe programs the kernel did not run"),
            !kernel_counts,
            "{short}: the summary on the kprobe hits not run\n{summary}"
        );
        let _ = std::io::Write::write_all(
            &mut std::io::stderr(),
            format!(
                "{vm_name}: {UPDATES} charges inside map updates: {} kprobe hits not run, {} program misses, {} calls counted, loss at most {}\n",
                p.kprobe_skipped, p.recursion_misses, p.count, p.lost_upper
            )
            .as_bytes(),
        );
    }
    if rt {
        check_rt_softirq(short, &r.out_dir);
    }
    if witness {
        check_witness(short, &r.out_dir);
    }
    // auto: fentry where programs cannot be preempted, kprobe where they can.
    // (Debian's configs: 6.18 and 7.3 preemptible on both architectures, PREEMPT_LAZY on
    // arm64 7.3; 6.12 voluntary; the RT builds preemptible by definition.)
    let preemptible = rt || matches!(short, "6.18" | "7.3" | "arm64-7.3");
    for run in ["auto", "fentry", "kprobe"] {
        let doc = load_recording(&r.out_dir.join(format!("{run}.json")));
        let summary = fs::read_to_string(r.out_dir.join(format!("{run}.txt"))).expect("summary");
        check_invariants(&doc, &summary);
        check_hdr_independently(&r.out_dir.join(format!("{run}.json")));
        check_hdr_log_independently(
            &r.out_dir.join(format!("{run}.hlog")),
            &r.out_dir.join(format!("{run}.json")),
        );
        assert_eq!(doc.meta.kernel_release, kernel.release);
        let reads = doc.meta.reads.as_deref().unwrap_or("");
        assert_eq!(
            reads.contains("the eBPF object for kernels before 5.19"),
            legacy,
            "{short} {run}: reads {reads:?}"
        );
        // The loader was spared its own parse of the kernel's BTF (tracer::kbtf), and the
        // programs still loaded and attached by the cut-down BTF's ids (checked below).
        assert_eq!(
            doc.meta.tracer.loader_btf_parsed, None,
            "{run}: the loader parsed the kernel's whole BTF"
        );
        assert_eq!(
            doc.meta.bpf_stats,
            run != "auto",
            "{run}: bpf stats only when asked"
        );
        let w = doc.meta.workload.as_ref().expect("workload");
        assert_eq!(
            w.exit_status,
            Some(0),
            "hackbench failed under --attach {run}"
        );
        assert!(
            w.cgroup.starts_with("/sys/fs/cgroup/memcg-trace."),
            "cgroup v2 memcg expected: {}",
            w.cgroup
        );
        let backend = match run {
            "auto" if preemptible => "kprobe",
            "auto" => "fentry",
            b => b,
        };
        assert!(
            doc.meta
                .floors
                .iter()
                .any(|f| f.backend.to_string() == backend && f.p50_ns > 0),
            "{short} {run}: no instrumentation floor measured for {backend}: {:?}",
            doc.meta.calibration
        );
        // 5.10's struct bpf_prog_stats has no recursion-miss counter (5.12): fentry's
        // interrupt pairs are confirmed in userspace there, and the recording says so.
        let expected: &[&str] = if legacy && run != "kprobe" {
            &["fentry interrupt pairs confirmed per tick in userspace"]
        } else {
            &[]
        };
        assert!(
            doc.meta.calibration.len() == expected.len()
                && doc
                    .meta
                    .calibration
                    .iter()
                    .zip(expected)
                    .all(|(c, e)| c.starts_with(e)),
            "{short} {run}: calibration fell short: {:?}",
            doc.meta.calibration
        );
        // The context split works on real probes, not only in the selftest: hackbench's
        // charging path is also entered from interrupts (rstat from the tick, stat from RCU).
        let irq: u64 = DEFAULT_PROBES
            .iter()
            .map(|n| ctx_count(probe(&doc, n), "softirq") + ctx_count(probe(&doc, n), "hardirq"))
            .sum();
        assert!(
            irq > 0,
            "{short} {run}: no interrupt-context calls in any default probe"
        );
        for name in DEFAULT_PROBES {
            let p = probe(&doc, name);
            // 5.10's __mod_memcg_state is split by the compiler and its file's callers call
            // __mod_memcg_state.part.0, which only kprobe can trace: auto takes kprobe there.
            let split = legacy && name == "stat";
            let backend = if split && run == "auto" {
                "kprobe"
            } else {
                backend
            };
            assert_eq!(
                p.backend.to_string(),
                backend,
                "{name} attached with {} under --attach {run}",
                p.backend
            );
            if split {
                let want = if backend == "kprobe" {
                    "__mod_memcg_state.part.0"
                } else {
                    "__mod_memcg_state"
                };
                assert_eq!(p.target, want, "{short} {run}: stat's target");
            }
            // The usual settings take the lean fentry/fexit programs (tracer::lean_programs).
            let names: Vec<&str> = p.programs.iter().map(|g| g.name.as_str()).collect();
            let want = if backend == "fentry" && legacy {
                ["fentry_", "fexit_"]
            } else if backend == "fentry" {
                ["fentry_lean_", "fexit_lean_"]
            } else {
                ["kprobe_", "kretprobe_"]
            };
            assert!(
                names.len() == 2
                    && names.iter().zip(want).all(|(n, w)| n.starts_with(w))
                    && (!legacy || !names.iter().any(|n| n.contains("_lean_"))),
                "{short} {run} {name}: programs {names:?}, expected {want:?}"
            );
            if legacy && name == "rstat" {
                assert!(
                    p.notes
                        .iter()
                        .any(|n| n.contains("not a step of memcg's path")),
                    "{short}: rstat's notes do not say it is not memcg's step: {:?}",
                    p.notes
                );
            }
            // fentry on the split function itself sees only the calls entering through it:
            // none on hackbench's path.
            if split && backend == "fentry" && p.count == 0 {
                let _ = std::io::Write::write_all(
                    &mut std::io::stderr(),
                    format!(
                        "{vm_name}: {run} stat ({}): no calls on this kernel\n",
                        p.target
                    )
                    .as_bytes(),
                );
                continue;
            }
            assert!(
                p.count > 0,
                "{short} {run}: {name} ({}) counted no calls",
                p.target
            );
            if run == "auto" {
                // The calls the kprobes missed apart: a hit while another kprobe handler runs
                // on that CPU (an interrupt's call during one). Under emulation a handler
                // lasts 10-100 times as long as on hardware while interrupts come as often,
                // so their share is inflated by as much (7.3, rstat: 1.5-2.3% of its calls
                // here, most of its interrupt-context calls among them); they are in "loss
                // at most" and held to 5% here, every other loss to 1%.
                let all = (p.count + p.lost_upper).max(1) as f64;
                let missed = p.kprobe_missed as f64 / all;
                let rest = p.lost_upper.saturating_sub(p.kprobe_missed) as f64 / all;
                assert!(
                    rest <= 0.01 && missed <= 0.05,
                    "{short} auto: {name} lost {:.2}% of its calls (at most 1%), the kprobes missed {:.2}% (at most 5%): {}",
                    rest * 100.0,
                    missed * 100.0,
                    memcg_trace::table::probe_footnote(p)
                );
            }
            let own = p.workload.as_ref().expect("workload figures").count;
            let task_calls = ctx_count(p, "task");
            assert!(
                own > 0 && own <= task_calls,
                "{short} {run} {name}: workload {own} vs system task {task_calls}"
            );
            let task = p
                .contexts
                .iter()
                .find(|c| c.context == "task")
                .expect("task context");
            let l = task
                .latency
                .as_ref()
                .expect("latency with function tracing");
            assert!(
                task.count > 0 && !l.percentiles.is_empty(),
                "{short} {run} {name}: no task-context latency"
            );
            let _ = std::io::Write::write_all(
                &mut std::io::stderr(),
                format!(
                    "{vm_name}: {run} {name}: p50 {} ns, p99 {} ns; {}\n",
                    l.percentiles[0].ns,
                    l.percentiles[2].ns,
                    memcg_trace::table::probe_footnote(p),
                )
                .as_bytes(),
            );
        }
    }
    // `memcg-trace probes --all` says, for each default probe, what `auto` attached.
    let listed = fs::read_to_string(r.out_dir.join("probes.txt")).unwrap_or_default();
    let auto = load_recording(&r.out_dir.join("auto.json"));
    for name in DEFAULT_PROBES {
        let p = probe(&auto, name);
        let backend = p.backend.to_string();
        let row = listed
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .map(|l| l.split_whitespace().collect::<Vec<_>>());
        assert!(
            row.as_ref().is_some_and(|f| f.len() >= 4
                && f[1] == p.target
                && f[2] == backend
                && f[3] == "attached"),
            "{short}: `probes --all` on {name}: {row:?}; auto attached {} via {backend}\n{listed}",
            p.target
        );
    }
    let leftover = fs::read_to_string(r.out_dir.join("leftover-memcgs")).unwrap_or_default();
    assert_eq!(leftover.trim(), "0", "memcgs left behind in the guest");
    // A failing workload's status passes through and its recording is still written.
    let status = fs::read_to_string(r.out_dir.join("exit3.status")).unwrap_or_default();
    assert_eq!(
        status.trim(),
        "3",
        "exit status of `sh -c 'exit 3'` under memcg-trace"
    );
    let doc = load_recording(&r.out_dir.join("exit3.json"));
    assert_eq!(
        doc.meta.workload.as_ref().and_then(|w| w.exit_status),
        Some(3)
    );
    // SIGTERM mid-run: 128+15, a valid recording, no memcg left.
    let status = fs::read_to_string(r.out_dir.join("term.status")).unwrap_or_default();
    assert_eq!(status.trim(), "143", "memcg-trace after SIGTERM");
    load_recording(&r.out_dir.join("term.json"));
    let leftover = fs::read_to_string(r.out_dir.join("leftover-after-term")).unwrap_or_default();
    assert_eq!(leftover.trim(), "0", "memcg left behind after SIGTERM");
}

/// The guest's part of the RT check (see `vm_matrix`): bpftrace on the function `stat` resolves
/// to, counting its calls by the running task's softirq count, while memcg-trace records `stat`
/// across a loopback TCP stream in the workload's memcg (busybox nc: 50 MiB).
const RT_SOCKETS: &str = r#"echo "guest: loopback stream beside bpftrace"
ifconfig lo 127.0.0.1 up
t=$(memcg-trace probes | awk '$1 == "stat" { print $2 }')
echo "$t" >/out/sock-target.txt
bpftrace -e "BEGIN { printf(\"ready\\n\"); } kprobe:$t /curtask->softirq_disable_cnt & 0x100/ { @softirq = count(); } kprobe:$t /!(curtask->softirq_disable_cnt & 0x100)/ { @other = count(); } kprobe:$t /!(curtask->softirq_disable_cnt & 0x100) && strncmp(comm, \"irq/\", 4) == 0/ { @irqthread = count(); }" >/out/sock-bt.txt 2>&1 &
bt=$!
i=0
while [ $i -lt 1200 ] && ! grep -qs ready /out/sock-bt.txt; do
  kill -0 $bt 2>/dev/null || { echo "bpftrace ended:"; cat /out/sock-bt.txt; exit 1; }
  sleep 0.1; i=$((i + 1))
done
echo "guest: bpftrace ready, the stream"
memcg-trace record -q -p stat -o /out/sock.json -- sh -c '(sleep 600 | nc -l -p 5001 >/dev/null) & sleep 1; dd if=/dev/zero bs=64k count=800 2>/dev/null | timeout 300 nc 127.0.0.1 5001; killall nc sleep; true' >/out/sock.txt 2>&1 || { cat /out/sock.txt; exit 1; }
kill -INT $bt
wait $bt || true
echo "guest: a shell named as an interrupt thread"
# A process that names itself as an interrupt thread does (threads are told by their name):
# its forks' charges must be counted as an interrupt thread's.
memcg-trace record -q -p charge -o /out/irqname.json -- sh -c 'printf irq/9-fake >/proc/$$/comm; i=0; while [ $i -lt 100 ]; do : | :; i=$((i + 1)); done' >/out/irqname.txt 2>&1 || { cat /out/irqname.txt; exit 1; }
"#;

/// kprobe before 6.7 on a preemptible kernel, where the kernel counts no program it skips: the
/// task calls that left the CPU (deferred to userspace) are proven by the switch witness.
/// - With nobody in a map system call (`auto`, kprobe here), the switches find no BPF section
///   held and the deferred calls are confirmed, with their time off the CPU: at most 1%
///   rejected (before the witness every one was, as unproven: 177 of 177 in a run).
/// - With a bpftool process preempted inside its map updates on CPU 0 all through the
///   hackbench run (`witness`): the witness saw switches with the section held, and the
///   deferred calls in flight then are rejected.
fn check_witness(short: &str, out: &Path) {
    let task = |p: &memcg_trace::export::ProbeOut,
                f: fn(&memcg_trace::export::ContextOut) -> u64|
     -> u64 {
        p.contexts
            .iter()
            .filter(|c| c.context == "task")
            .map(f)
            .sum()
    };
    let doc = load_recording(&out.join("auto.json"));
    let summary = fs::read_to_string(out.join("auto.txt")).expect("summary");
    let (mut deferred, mut proven, mut rejected, mut off) = (0, 0, 0, 0);
    for p in &doc.probes {
        assert_eq!(
            p.backend.to_string(),
            "kprobe",
            "{short}: auto took {} for {}",
            p.backend,
            p.name
        );
        assert!(
            p.held_switches.is_some(),
            "{short}: {}'s deferred pairs not proven by the switch witness\n{summary}",
            p.name
        );
        deferred += task(p, |c| c.deferred);
        proven += task(p, |c| c.proven_on_cpu);
        rejected += task(p, |c| c.rejected);
        off += task(p, |c| c.off_cpu_ns);
    }
    // The calls that left the CPU without moving off it are proven by the programs from the
    // witness's count on their CPU; the others are deferred and checked per tick.
    assert!(
        deferred + proven >= 50 && rejected * 100 <= deferred && off > 0 && proven > 0,
        "{short}: auto: {proven} task calls proven on their CPU, {deferred} deferred, {rejected} rejected, {off} ns off the CPU: at least 50 in all, some proven, at most 1% rejected and some time off the CPU expected\n{summary}"
    );
    assert!(
        summary.contains("calls that left the CPU checked by the switch witness"),
        "{short}: the footnote does not say how the calls that left the CPU were proven\n{summary}"
    );
    // Its own cost, one run per context switch, told beside the daemon's; counted where the
    // kernel's bpf stats were on (the kprobe recording).
    assert!(
        doc.meta
            .tracer
            .other_programs
            .iter()
            .any(|p| p.name == "held_switch")
            && summary.contains("also attached: held_switch"),
        "{short}: auto: the switch witness is not among the programs attached\n{summary}"
    );
    let kdoc = load_recording(&out.join("kprobe.json"));
    let ksummary = fs::read_to_string(out.join("kprobe.txt")).expect("summary");
    let witness = kdoc
        .meta
        .tracer
        .other_programs
        .iter()
        .find(|p| p.name == "held_switch")
        .unwrap_or_else(|| {
            panic!("{short}: the switch witness's runs are not recorded\n{ksummary}")
        });
    assert!(
        kdoc.meta.bpf_stats
            && witness.run_cnt > 0
            && witness.ns_per_run.is_some()
            && ksummary.contains("also attached: held_switch ran"),
        "{short}: kprobe: the switch witness ran {} times ({:?} ns a run), the summary says:\n{ksummary}",
        witness.run_cnt,
        witness.ns_per_run
    );
    let charge_ns: f64 = probe(&kdoc, "charge")
        .programs
        .iter()
        .filter_map(|p| p.ns_per_run)
        .sum();
    let witness_cost = format!(
        "{} runs, {:.0} ns a run (charge's programs {charge_ns:.0} ns a call, {} calls)",
        witness.run_cnt,
        witness.ns_per_run.unwrap_or(f64::NAN),
        probe(&kdoc, "charge").count
    );
    let doc = load_recording(&out.join("witness.json"));
    let summary = fs::read_to_string(out.join("witness.txt")).expect("summary");
    check_invariants(&doc, &summary);
    let p = probe(&doc, "charge");
    let held = p.held_switches.unwrap_or(0);
    let (deferred_held, rejected_held, proven_held) = (
        task(p, |c| c.deferred),
        task(p, |c| c.rejected),
        task(p, |c| c.proven_on_cpu),
    );
    // (bpftool's own charges, made inside its map updates, are kprobe hits not run whether or
    // not it is preempted: the witness is the switches.)
    assert!(
        held > 0,
        "{short}: a bpftool process preempted in its map updates: no switch found a BPF section held ({} kprobe hits not run)\n{summary}",
        p.kprobe_skipped
    );
    // Which deferred calls overlap a held switch depends on when bpftool is preempted (122 of
    // 122 rejected in one run, 62 of 167 in another, before the programs proved calls on
    // their CPU): some must be. The calls on CPU 0 that left it while the section was held
    // there are never proven by the programs: the witness's count on CPU 0 moved.
    // Everything runs on CPU 0: a call is deferred there only if CPU 0's count moved while it
    // ran (or its entry came before the programs were told where the count is), and such a
    // move is in the per-tick check's window too: those calls are rejected, all but the
    // few of the start (291 of 291 in a run).
    assert!(
        deferred_held + proven_held >= 10 && rejected_held >= 1 && rejected_held * 10 >= deferred_held * 9,
        "{short}: beside a preempted map update: {proven_held} proven on their CPU, {deferred_held} deferred, {rejected_held} rejected: at least 10 in all, some rejected and at least 90% of the deferred expected\n{summary}"
    );
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        format!(
            "{short}: switch witness: auto {proven} proven on their CPU, {deferred} deferred, {rejected} rejected, {off} ns off the CPU, the witness itself {witness_cost}; beside a preempted map update {held} held switches, {} kprobe hits not run, {proven_held} proven, {deferred_held} deferred, {rejected_held} rejected\n",
            p.kprobe_skipped
        )
        .as_bytes(),
    );
}

/// On PREEMPT_RT the context split takes softirq from the task's count, says so, and sees the
/// softirq calls the kernel's own field says there are: memcg-trace's softirq row of `stat`
/// against bpftrace's count of calls made while the task served a softirq, over a window that
/// holds the recording's (so bpftrace's is the larger, by the calls of its extra moments and
/// those memcg-trace lost).
fn check_rt_softirq(short: &str, out: &Path) {
    let bt = fs::read_to_string(out.join("sock-bt.txt")).unwrap_or_default();
    let count_of = |name: &str| -> Option<u64> {
        bt.lines()
            .find_map(|l| l.strip_prefix(&format!("@{name}: ")))
            .and_then(|v| v.trim().parse().ok())
    };
    // (A map bpftrace never wrote to is not printed: none such calls.)
    let bt_irq_thread = count_of("irqthread").unwrap_or(0);
    let (Some(bt_soft), Some(bt_other)) = (count_of("softirq"), count_of("other")) else {
        panic!("{short}: bpftrace gave no counts:\n{bt}");
    };
    let doc = load_recording(&out.join("sock.json"));
    let summary = fs::read_to_string(out.join("sock.txt")).expect("summary");
    check_invariants(&doc, &summary);
    let masks = doc.meta.context_masks.as_ref().expect("context masks");
    assert_eq!(
        (masks.softirq.as_str(), masks.source.as_str()),
        ("task", "calibrated"),
        "{short}: the softirq count's source on PREEMPT_RT\n{summary}"
    );
    assert!(
        summary.contains("softirq from the task's softirq_disable_cnt: PREEMPT_RT"),
        "{short}: the header does not say where softirq was read\n{summary}"
    );
    assert!(
        doc.meta.preemption_model.starts_with("PREEMPT_RT"),
        "{short}: preemption model {:?}",
        doc.meta.preemption_model
    );
    let p = probe(&doc, "stat");
    let soft = ctx_count(p, "softirq");
    let all = p.count;
    let lost = p.lost_upper;
    // The loopback stream's receive charges: thousands of softirq calls.
    assert!(
        bt_soft >= 100,
        "{short}: the stream made only {bt_soft} softirq calls of {} by the kernel's count",
        p.target
    );
    assert!(
        soft <= bt_soft && soft + lost + bt_soft / 100 + 10 >= bt_soft,
        "{short}: stat's softirq calls: memcg-trace {soft} (lost at most {lost}), the kernel's field (bpftrace) {bt_soft}\n{summary}"
    );
    // Threaded interrupt handlers' calls, task context by the kernel's definition, counted
    // apart (bpftrace's window is the longer one here too).
    assert!(
        masks.threads,
        "{short}: interrupt threads not counted apart"
    );
    let irq_thread: u64 = p.contexts.iter().map(|c| c.irq_thread).sum();
    assert!(
        irq_thread <= bt_irq_thread,
        "{short}: stat: {irq_thread} calls of interrupt threads, bpftrace {bt_irq_thread} over a longer window\n{summary}"
    );
    assert!(
        all <= bt_soft + bt_other,
        "{short}: stat: memcg-trace {all} calls, bpftrace {} over a longer window",
        bt_soft + bt_other
    );
    // The thread's name read by the programs: a shell named as an interrupt thread, whose
    // forks charge (its first calls, before it renamed itself, are not the thread's).
    let named = load_recording(&out.join("irqname.json"));
    let summary = fs::read_to_string(out.join("irqname.txt")).expect("summary");
    check_invariants(&named, &summary);
    let c = probe(&named, "charge");
    let by_irq: u64 = c.contexts.iter().map(|x| x.irq_thread).sum();
    let own = c.workload.as_ref().expect("workload figures").count;
    assert!(
        by_irq >= 200 && by_irq * 10 >= own * 9 && by_irq <= ctx_count(c, "task"),
        "{short}: a workload named irq/9-fake: {by_irq} of its {own} charges counted as an interrupt thread's\n{summary}"
    );
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        format!(
            "vm_matrix_{}: a shell named irq/9-fake: {by_irq} of its {own} charges as an interrupt thread's\n",
            short.replace(['.', '-'], "_")
        )
        .as_bytes(),
    );
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        format!(
            "vm_matrix_{}: loopback stream, {} ({}): softirq {soft} of {all} calls (lost at most {lost}), {irq_thread} by interrupt threads; bpftrace by softirq_disable_cnt: softirq {bt_soft}, other {bt_other}; by interrupt threads {bt_irq_thread}\n",
            short.replace(['.', '-'], "_"),
            p.target,
            p.backend
        )
        .as_bytes(),
    );
}

/// A recording made where no source gives the per-CPU offsets: latency without the context
/// split, every call under context `all`, and said in the header, the table and the JSON.
fn check_no_context_split(out: &std::path::Path) {
    let json = out.join("nosplit.json");
    let doc = load_recording(&json);
    let summary = fs::read_to_string(out.join("nosplit.txt")).expect("summary");
    check_invariants(&doc, &summary);
    let masks = doc.meta.context_masks.as_ref().expect("context masks");
    assert!(
        masks.source.starts_with("none: no context split") && masks.percpu == "none",
        "masks without per-CPU offsets: {masks:?}"
    );
    assert!(
        doc.meta
            .calibration
            .iter()
            .any(|c| c.contains("no context split") && c.contains("kptr_restrict")),
        "the recording does not say why there is no context split: {:?}",
        doc.meta.calibration
    );
    assert!(
        summary.contains("WARNING") && summary.contains("no context split"),
        "the table does not say it:\n{summary}"
    );
    assert!(
        !summary
            .lines()
            .any(|l| l.split_whitespace().nth(1) == Some("task")),
        "a row still says task without the context split:\n{summary}"
    );
    for name in ["charge", "rstat"] {
        let p = probe(&doc, name);
        // Interrupt calls share the task slots there: auto takes kprobe, whose programs never
        // interleave on a CPU.
        assert_eq!(p.backend.to_string(), "kprobe", "{name} without the split");
        assert!(
            p.notes
                .iter()
                .any(|n| n.contains("without the context split")),
            "{name}: {:?}",
            p.notes
        );
        let names: Vec<&str> = p.contexts.iter().map(|c| c.context.as_str()).collect();
        assert_eq!(names, ["all"], "{name}: contexts without the split");
        let c = &p.contexts[0];
        assert!(
            c.count > 0
                && c.latency
                    .as_ref()
                    .is_some_and(|l| !l.percentiles.is_empty()),
            "{name}: no latency without the context split"
        );
        assert!(
            summary
                .lines()
                .any(|l| l.starts_with(name) && l.split_whitespace().nth(1) == Some("all")),
            "{name}: no `all` row in the table:\n{summary}"
        );
    }
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        format!(
            "vm_matrix_5_10: without per-CPU offsets: charge {} calls, rstat {} calls, all under `all`\n",
            probe(&doc, "charge").count,
            probe(&doc, "rstat").count
        )
        .as_bytes(),
    );
}

#[test]
fn vm_matrix_5_10() {
    vm_matrix("5.10");
}

#[test]
fn vm_matrix_6_1() {
    vm_matrix("6.1");
}

#[test]
fn vm_matrix_6_12() {
    vm_matrix("6.12");
}

#[test]
fn vm_matrix_6_18() {
    vm_matrix("6.18");
}

#[test]
fn vm_matrix_7_3() {
    vm_matrix("7.3");
}

#[test]
fn vm_matrix_6_1_rt() {
    vm_matrix("6.1-rt");
}

#[test]
fn vm_matrix_6_12_rt() {
    vm_matrix("6.12-rt");
}

#[test]
fn vm_matrix_arm64_6_12() {
    vm_matrix("arm64-6.12");
}

#[test]
fn vm_matrix_arm64_7_3() {
    vm_matrix("arm64-7.3");
}

/// What is arm64's own in a matrix run: the preempt count read from the task's thread_info,
/// the masks calibrated there, hardirq classified right on arm64's IPI tracepoint (x86's
/// vector tracepoints do not exist there), and the recording saying which architecture ran.
fn check_arm64(r: &vm::VmResult, selftest: &str) {
    let doc = load_recording(&r.out_dir.join("auto.json"));
    let reads = doc.meta.reads.as_deref().unwrap_or("");
    assert!(
        reads.contains("preempt count from the running task's thread_info"),
        "arm64: the programs do not read the preempt count from the task: {reads:?}"
    );
    assert!(
        doc.meta.kernel_release.ends_with("-arm64"),
        "{}",
        doc.meta.kernel_release
    );
    let masks = doc.meta.context_masks.as_ref().expect("context masks");
    // Calibrated on the kernel itself: 6.12's classic layout (hardirq 0xf0000), 7.3's with
    // the hardirq field moved up (0xf000000), which no constant would have known.
    assert!(
        masks.source == "calibrated"
            && masks.softirq_offset == 0x100
            && masks.hardirq_mask.count_ones() == 4
            && masks.hardirq_mask > masks.softirq_offset,
        "arm64 masks: {masks:?}"
    );
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        format!(
            "{}: arm64 masks softirq {:#x}, hardirq {:#x}, nmi {:#x} ({})\n",
            doc.meta.kernel_release,
            masks.softirq_offset,
            masks.hardirq_mask,
            masks.nmi_mask,
            masks.nmi
        )
        .as_bytes(),
    );
    assert!(
        selftest.lines().any(|l| l
            .starts_with("selftest: ipi_entry (hardirq, independent source)")
            && l.ends_with(" ok")
            && !l.contains(": 0 hits")),
        "arm64: hardirq not checked on ipi_entry:\n{selftest}"
    );
    // fentry's interrupt pairs are decided in the kernel, by the entry program's miss counter
    // read through the per-CPU offset (`__per_cpu_start`-based there): none deferred to
    // userspace, whose per-tick check rejects every pair of a tick with a miss.
    let doc = load_recording(&r.out_dir.join("fentry.json"));
    let hard: Vec<_> = doc
        .probes
        .iter()
        .flat_map(|p| p.contexts.iter().filter(|c| c.context == "hardirq"))
        .collect();
    assert!(
        hard.iter().any(|c| c.paired > 0) && hard.iter().all(|c| c.deferred == 0),
        "arm64 fentry: hardirq pairs deferred to userspace: {:?}",
        hard.iter()
            .map(|c| (c.paired, c.deferred, c.rejected))
            .collect::<Vec<_>>()
    );
}

/// The kernel `short` for a test that boots one kernel, fetched; None (with the skip recorded)
/// when it is not selected or this is not root.
fn one_kernel(name: &str, short: &str) -> Option<kernels::Kernel> {
    let wanted =
        std::env::var("MEMCG_TRACE_KERNELS").unwrap_or_else(|_| kernels::test_matrix().join(","));
    if !wanted.split(',').any(|k| k.trim() == short) {
        skip(
            name,
            &format!("kernel {short} not in MEMCG_TRACE_KERNELS={wanted}"),
        );
        return None;
    }
    if !is_root() {
        skip(name, "needs root (apt-get download of the kernel)");
        return None;
    }
    let spec = kernels::select(short).expect("known kernel")[0];
    Some(kernels::fetch(spec).unwrap_or_else(|e| panic!("fetch kernel {short}: {e:#}")))
}

/// Boots `kernel` with `script`, memcg-trace and hackbench in the initramfs (and `modules`),
/// and fails with the tail of the guest console unless the script succeeded.
fn boot(
    kernel: &kernels::Kernel,
    name: String,
    script: String,
    modules: Vec<std::path::PathBuf>,
) -> vm::VmResult {
    boot_on(kernel, name, script, modules, Vec::new(), 0, None)
}

/// `boot` with more host programs (and their libraries) in the initramfs, on `cpus` vCPUs (0:
/// the default) and, under TCG, with `icount`: the guest clock counts instructions
/// (`-icount shift=N`).
fn boot_on(
    kernel: &kernels::Kernel,
    name: String,
    script: String,
    modules: Vec<std::path::PathBuf>,
    extra_bins: Vec<std::path::PathBuf>,
    cpus: u32,
    icount: Option<u32>,
) -> vm::VmResult {
    boot_with_nmis(
        kernel, name, script, modules, extra_bins, cpus, icount, None,
    )
}

/// [`boot_on`], with an NMI injected every `nmis` (x86_64).
#[allow(clippy::too_many_arguments)]
fn boot_with_nmis(
    kernel: &kernels::Kernel,
    name: String,
    script: String,
    modules: Vec<std::path::PathBuf>,
    extra_bins: Vec<std::path::PathBuf>,
    cpus: u32,
    icount: Option<u32>,
    nmis: Option<Duration>,
) -> vm::VmResult {
    let r = vm::run(
        kernel,
        &VmSpec {
            name,
            script,
            bins: [
                bin(),
                memcg_trace::workload::hackbench().expect("hackbench (rt-tests)"),
            ]
            .into_iter()
            .chain(extra_bins)
            .collect(),
            accel: accel(),
            timeout: Duration::from_secs(900),
            echo: false,
            modules,
            mem_mb: 0,
            cpus,
            icount: icount.filter(|_| accel() == Accel::Tcg),
            packages: Vec::new(),
            files: Vec::new(),
            nmis,
        },
    )
    .expect("start the VM");
    assert!(
        r.success,
        "{}: {}\n--- last console lines ({}) ---\n{}",
        kernel.release,
        r.failure.as_deref().unwrap_or(""),
        r.log.display(),
        r.tail(60)
    );
    r
}

/// A kernel the user built, given by path (`--kernel-image`): Debian's 6.12 image and config
/// copied where a kernel tree would leave them, under other names, so that no package name or
/// cache path is involved. Its release is read from the image, its config found beside it,
/// nothing is said missing, and it boots and traces as 6.12 does. The same image beside a
/// config without BTF is refused by `cargo xtask vm --kernel-image` in one line, before anything
/// boots.
#[test]
fn vm_own_kernel_image_6_12() {
    let name = "vm_own_kernel_image_6_12";
    let Some(stock) = one_kernel(name, "6.12") else {
        return;
    };
    let tree = xtask::workspace_root().join("target/vm/own-kernel-tree");
    let _ = fs::remove_dir_all(&tree);
    let boot_dir = tree.join("arch/x86/boot");
    fs::create_dir_all(&boot_dir).unwrap();
    let image = boot_dir.join("bzImage");
    fs::copy(&stock.vmlinuz, &image).unwrap();
    fs::copy(&stock.config, tree.join(".config")).unwrap();
    let (own, missing) = xtask::own::own_kernel(&image, None, None)
        .unwrap_or_else(|e| panic!("{name}: Debian's 6.12 image refused: {e:#}"));
    assert_eq!(
        own.release, stock.release,
        "{name}: the release read from the image"
    );
    assert_eq!(own.config, tree.join(".config"), "{name}: the config found");
    assert!(
        missing.is_empty(),
        "{name}: said missing on Debian's 6.12: {missing:?}"
    );
    let r = boot(
        &own,
        "own-6.12-test".into(),
        xtask::record_script("fentry", "-g 1 -l 50", false),
        Vec::new(),
    );
    let doc = load_recording(&r.out_dir.join("fentry.json"));
    let summary = fs::read_to_string(r.out_dir.join("fentry.txt")).expect("summary");
    check_invariants(&doc, &summary);
    assert_eq!(doc.meta.kernel_release, stock.release, "{name}\n{summary}");
    let charge = probe(&doc, "charge");
    assert!(
        charge.backend.to_string() == "fentry" && charge.count > 0,
        "{name}: charge by {} with {} calls\n{summary}",
        charge.backend,
        charge.count
    );
    // Without BTF: refused before booting, one line naming the option.
    let config = fs::read_to_string(&stock.config).unwrap();
    fs::write(
        tree.join(".config"),
        config.replace(
            "CONFIG_DEBUG_INFO_BTF=y",
            "# CONFIG_DEBUG_INFO_BTF is not set",
        ),
    )
    .unwrap();
    let xtask_bin = xtask::workspace_root().join("target/debug/xtask");
    if !xtask_bin.exists() {
        let _ = fs::remove_dir_all(&tree);
        skip_case(
            name,
            "the refusal through the command: target/debug/xtask not built (cargo xtask builds it)",
        );
        return;
    }
    let out = std::process::Command::new(&xtask_bin)
        .args(["vm", "--kernel-image"])
        .arg(&image)
        .output()
        .expect("run xtask");
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| l.contains("CONFIG_")).collect();
    assert!(
        out.status.code() == Some(1)
            && lines.len() == 1
            && lines[0].contains("not booting")
            && lines[0].contains("CONFIG_DEBUG_INFO_BTF is not set")
            && !err.contains("booting your kernel"),
        "{name}: a config without BTF: exit {:?}, stderr:\n{err}",
        out.status.code()
    );
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        format!(
            "{name}: {} read from the image, config found at {}; charge {} calls by fentry; without BTF: {}\n",
            own.release,
            own.config.display(),
            charge.count,
            lines[0]
        )
        .as_bytes(),
    );
    let _ = fs::remove_dir_all(&tree);
}

/// `serve` in a VM, where latencies exist: one scrape after the workload ended, then the
/// recording of the same run (`-o`). The workload's row is final once it exited, so its calls in
/// the exposition equal the recording's exactly (the system-wide rows go on counting until the
/// stop: never more in the scrape than in the recording), and Prometheus's
/// `histogram_quantile(0.99, ...)` computed on the scraped buckets falls in the octave that holds
/// the recording's p99.
#[test]
fn vm_serve_6_12() {
    let name = "vm_serve_6_12";
    let short = "6.12";
    let Some(kernel) = one_kernel(name, short) else {
        return;
    };
    let r = boot(
        &kernel,
        format!("{short}-serve"),
        xtask::serve_script(),
        Vec::new(),
    );
    let doc = load_recording(&r.out_dir.join("serve.json"));
    let text = fs::read_to_string(r.out_dir.join("metrics.txt")).expect("the scrape");
    let charge = probe(&doc, "charge");
    let task = charge
        .contexts
        .iter()
        .find(|c| c.context == "task")
        .expect("charge task");
    let workload = charge.workload.as_ref().expect("charge's workload row");
    // The contexts' series, or (context "workload") the workload's families.
    let series = |suffix: &str, context: &str, extra: &str| {
        if context == "workload" {
            format!(
                "memcg_trace_workload_{suffix}{{probe=\"charge\",symbol=\"{}\",backend=\"{}\"{extra}}} ",
                charge.target, charge.backend
            )
        } else {
            format!(
                "memcg_trace_{suffix}{{probe=\"charge\",context=\"{context}\",symbol=\"{}\",backend=\"{}\"{extra}}} ",
                charge.target, charge.backend
            )
        }
    };
    let value = |s: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(s))
            .unwrap_or_else(|| panic!("{s} not in the scrape:\n{text}"))
            .trim()
            .parse()
            .unwrap()
    };
    let scraped = value(&series("calls_total", "workload", ""));
    assert!(
        scraped > 0.0 && scraped == workload.count as f64,
        "workload: scraped {scraped} vs recorded {}",
        workload.count
    );
    let scraped_task = value(&series("calls_total", "task", ""));
    assert!(
        scraped_task >= scraped && scraped_task <= task.count as f64,
        "task: scraped {scraped_task} vs recorded {} (workload {scraped})",
        task.count
    );
    // histogram_quantile as Prometheus computes it: the bucket where the rank falls, linear
    // inside it.
    let les: Vec<(f64, f64)> = text
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(
                &series("latency_seconds_bucket", "workload", "").replace("\"} ", "\","),
            )?;
            let (le, v) = rest.strip_prefix("le=\"")?.split_once("\"} ")?;
            Some((
                if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().ok()?
                },
                v.trim().parse().ok()?,
            ))
        })
        .collect();
    assert!(les.len() >= 20, "latency buckets: {les:?}\n{text}");
    let total = les.last().unwrap().1;
    let rank = 0.99 * total;
    let bucket = les.iter().position(|b| b.1 >= rank).unwrap();
    let (lo, below) = if bucket == 0 {
        (0.0, 0.0)
    } else {
        les[bucket - 1]
    };
    let (hi, at) = les[bucket];
    let quantile = lo + (hi - lo) * (rank - below) / (at - below);
    let p99 = workload
        .latency
        .as_ref()
        .expect("workload latency")
        .percentiles
        .iter()
        .find(|x| (x.q - 0.99).abs() < 1e-9)
        .expect("p99")
        .ns as f64
        / 1e9;
    assert!(
        lo < p99 && p99 <= hi * 1.0000001 && lo <= quantile && quantile <= hi,
        "histogram_quantile(0.99) {quantile:e} s in ({lo:e}, {hi:e}], the recording's p99 {p99:e} s"
    );
    assert!(text.lines().any(|l| l == "memcg_trace_up 1"), "{text}");
    // `--callers`: the top sites of each probe and context as counters; each is a site of the
    // recording, with no more calls than the recording has there at the stop.
    let mut sites = 0;
    for l in text
        .lines()
        .filter(|l| l.starts_with("memcg_trace_caller_calls_total{"))
    {
        let (labels, v) = l.rsplit_once("} ").expect("a sample");
        let get = |k: &str| {
            labels
                .split(&format!("{k}=\""))
                .nth(1)
                .and_then(|x| x.split('"').next())
                .unwrap_or("")
                .to_string()
        };
        let scraped_probe = probe(&doc, &get("probe"));
        let site = scraped_probe
            .callers
            .iter()
            .find(|s| s.context == get("context") && s.site == get("site"))
            .unwrap_or_else(|| panic!("scraped site not in the recording: {l}"));
        let v: f64 = v.trim().parse().unwrap();
        assert!(
            v > 0.0 && v <= site.calls as f64,
            "{l}: recording {}",
            site.calls
        );
        sites += 1;
    }
    assert!(sites >= 3, "call-site series: {sites}\n{text}");
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        format!(
            "{name}: scrape {} bytes, {} series ({sites} call-site series); charge workload: {scraped} calls scraped, {} recorded (task: {scraped_task} scraped, {} recorded at the stop); histogram_quantile(0.99) {:.2} us, recording's p99 {:.2} us, both in ({:.2}, {:.2}] us\n",
            text.len(),
            text.lines().filter(|l| !l.starts_with('#')).count(),
            workload.count,
            task.count,
            quantile * 1e6,
            p99 * 1e6,
            lo * 1e6,
            hi * 1e6
        )
        .as_bytes(),
    );
}

/// The built-in workloads of the upstream debates (`--workload open-loop`, `--workload
/// kmalloc`) with their operations: each open of a nonexistent path allocates and frees a
/// struct file (an accounted cache), each pipe made and closed two kmalloc(GFP_KERNEL_ACCOUNT)
/// objects besides its files, inode and dentry. The recording knows the operations, and the
/// calls per operation are what the kernel's code makes: two charges and one slab free by the
/// workload an open, six and six a pipe. Then `--workload sockets` (`check_sockets`), and no
/// memcg of memcg-trace's left behind.
fn workloads_on(name: &str, short: &str) {
    let Some(kernel) = one_kernel(name, short) else {
        return;
    };
    let script = r#"
echo "guest: open-loop"
memcg-trace record -p charge,slab_free --workload open-loop:20000 -o /out/open.json >/out/open.txt 2>&1
echo "guest: kmalloc"
memcg-trace record -p charge,slab_free --workload kmalloc:5000 -o /out/kmalloc.json >/out/kmalloc.txt 2>&1
echo "guest: sockets"
memcg-trace record -p try_charge,stat --by-memcg --workload sockets:4000 -o /out/sockets.json >/out/sockets.txt 2>&1
echo "guest: sockets in a given memcg, stopped by --duration"
echo +memory >/sys/fs/cgroup/cgroup.subtree_control
mkdir /sys/fs/cgroup/given
memcg-trace record -q -p try_charge --cgroup /sys/fs/cgroup/given --duration 3s --workload sockets:1000000 -o /out/stopped.json >/out/stopped.txt 2>&1 || true
cat /sys/fs/cgroup/given/cgroup.subtree_control >/out/given-control.txt
ls /sys/fs/cgroup/given | grep -c '^sockets-' >/out/given-children.txt || true
wc -l </sys/fs/cgroup/given/cgroup.procs >/out/given-procs.txt
memcg-trace record -q -p try_charge --cgroup /sys/fs/cgroup/given -o /out/again.json -- true >/out/again.txt 2>&1 && echo 0 >/out/again.status || echo $? >/out/again.status
cat /out/open.txt /out/kmalloc.txt /out/sockets.txt
if command -v perf >/dev/null; then
  echo "guest: hackbench and perf bench sched messaging"
  memcg-trace record -p charge --workload hackbench:"-g 1 -l 50" -o /out/hackbench.json >/out/hackbench.txt 2>&1
  memcg-trace record -p charge --workload perf-messaging:"-g 1 -l 50" -o /out/perf.json >/out/perf.txt 2>&1
  cat /out/perf.txt
fi
ls -d /sys/fs/cgroup/memcg-trace.* 2>/dev/null | wc -l >/out/left.txt
"#;
    // perf (linux-perf, which `cargo xtask setup` installs) for its `bench sched messaging`.
    let perf = xtask::which("perf").ok();
    let r = boot_on(
        &kernel,
        format!("{short}-workloads"),
        script.into(),
        Vec::new(),
        perf.iter().cloned().collect(),
        0,
        None,
    );
    let mut said = Vec::new();
    // Measured on 6.12 and 7.3: 2.01 charges and 1.01 slab frees by the workload an open (the
    // struct file and one more object charged; the rest of the 0.01 is memcg-trace's own start
    // as the workload), 6.03-6.04 charges and 6.04-6.06 frees a pipe (pipe_inode_info, its
    // buffers, two files, an inode, a dentry). Held to 0.9x of that, and to at most 1.25x.
    for (file, unit, ops, charges, frees) in [
        ("open", "opens", 20_000u64, 2.0, 1.0),
        ("kmalloc", "pipes", 5_000, 6.0, 6.0),
    ] {
        let doc = load_recording(&r.out_dir.join(format!("{file}.json")));
        let summary = fs::read_to_string(r.out_dir.join(format!("{file}.txt"))).expect("summary");
        check_invariants(&doc, &summary);
        let w = doc.meta.workload.as_ref().expect("the workload");
        assert_eq!(w.exit_status, Some(0), "{name}: {file}\n{summary}");
        let o = w.operations.as_ref().expect("the workload's operations");
        assert_eq!((o.count, o.unit.as_str()), (ops, unit), "{name}: {file}");
        let charge = probe(&doc, "charge");
        let free = probe(&doc, "slab_free");
        let per_op = |n: u64| n as f64 / ops as f64;
        let charged = per_op(charge.workload.as_ref().map_or(0, |w| w.count));
        let freed_by_it = per_op(free.workload.as_ref().map_or(0, |w| w.count));
        let freed = per_op(free.count);
        let near = |v: f64, want: f64| v >= 0.9 * want && v <= 1.25 * want;
        assert!(
            near(charged, charges) && near(freed_by_it, frees) && freed >= freed_by_it,
            "{name}: {file}: {charged:.3} charges ({}) and {freed_by_it:.3} slab frees ({}) of the workload an operation, {charges} and {frees} expected (within 0.9-1.25x); {freed:.3} frees an operation in all contexts\n{summary}",
            charge.target,
            free.target
        );
        assert!(
            summary.contains(&format!("per operation ({ops} {unit}): charge ")),
            "{name}: {file}: the table does not give the calls per operation\n{summary}"
        );
        said.push(format!(
            "{file}: charge ({}, {}) {charged:.3}/op by the workload, slab_free ({}) {freed_by_it:.3}/op by it, {freed:.3}/op in all",
            charge.target, charge.backend, free.target
        ));
    }
    said.push(check_sockets(name, &r.out_dir));
    check_sockets_stopped(name, &r.out_dir);
    if perf.is_some() {
        said.push(check_perf_messaging(name, &r.out_dir));
    } else {
        skip(
            &format!("{name} (perf bench sched messaging)"),
            "perf (linux-perf) is missing",
        );
    }
    let left = fs::read_to_string(r.out_dir.join("left.txt")).unwrap_or_default();
    assert_eq!(left.trim(), "0", "{name}: memcgs left behind");
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        format!("{name}: {}\n", said.join("; ")).as_bytes(),
    );
}

/// The sockets workload (`--by-memcg`): 4,000 messages of 64 KiB over loopback TCP to 4
/// clients, each in a memcg of its own below the workload's. Its calls of `try_charge` and
/// `stat` are those charging the workload's memcg or one below, in every context: the
/// receive side charges the clients' memcgs in the NET_RX softirq. Checked:
/// - the softirq charges (`try_charge`) charge the clients' memcgs (>= 90% of them, by the
///   per-memcg rows; 99.9% measured);
/// - the workload's rows hold exactly the calls of the per-memcg rows below its memcg (two
///   separate paths in the programs: the per-memcg map and the workload's set with its
///   climb). Before the climb, the memcgs the workload made were in its set only from the
///   next tick: 5,869 of 15,400 try_charge calls and 9,501 of 24,500 stat calls counted;
/// - calls per message: a message is charged on both sides (>= 1 try_charge a message), and
///   the receive side's softirq charges are >= 0.5 a message (measured on 6.12: 3.86
///   try_charge and 6.13 stat a message, 1.27 try_charge a message in softirq).
fn check_sockets(name: &str, out: &Path) -> String {
    let doc = load_recording(&out.join("sockets.json"));
    let summary = fs::read_to_string(out.join("sockets.txt")).expect("summary");
    check_invariants(&doc, &summary);
    // The clients were in memcgs of their own, and everything was given back.
    assert!(
        !summary.contains("share the workload's memcg") && !summary.contains("not given back"),
        "{name}: sockets: the sub-memcgs were not used or not given back\n{summary}"
    );
    let w = doc.meta.workload.as_ref().expect("the workload");
    assert_eq!(w.exit_status, Some(0), "{name}: sockets\n{summary}");
    let ops = w.operations.as_ref().expect("the workload's operations");
    assert_eq!(
        (ops.count, ops.unit.as_str()),
        (4000, "64 KiB messages"),
        "{name}: sockets"
    );
    let root = w
        .cgroup
        .strip_prefix("/sys/fs/cgroup")
        .expect("the workload's memcg under /sys/fs/cgroup")
        .to_string();
    let mut said = Vec::new();
    for p in ["try_charge", "stat"] {
        let pr = probe(&doc, p);
        let below = |c: &str| c == root || c.starts_with(&format!("{root}/"));
        // A memcg removed before it was named is the workload's: nothing else in the guest
        // makes or removes memcgs during this run (the earlier runs' memcgs were gone before
        // it began).
        let of_workload = |c: &str| below(c) || c.starts_with("removed cgroup");
        let in_rows: u64 = pr
            .memcgs
            .iter()
            .filter(|m| of_workload(&m.cgroup))
            .map(|m| m.calls)
            .sum();
        let workload = pr.workload.as_ref().map_or(0, |w| w.count);
        assert!(
            workload == in_rows && workload > 0,
            "{name}: sockets: {p}: the workload's row has {workload} calls, the per-memcg rows below its memcg {root} {in_rows}\n{summary}"
        );
        let softirq: u64 = pr
            .contexts
            .iter()
            .filter(|c| c.context == "softirq")
            .map(|c| c.count)
            .sum();
        let to_clients: u64 = pr
            .memcgs
            .iter()
            .filter(|m| m.context == "softirq" && m.cgroup.contains("/sockets-client-"))
            .map(|m| m.calls)
            .sum();
        // Charges only: `stat` also counts the uncharges, and the server's socket is
        // uncharged in softirq when the clients' acknowledgements free its send queue (7.3:
        // 919 of 4,539 softirq stat calls).
        assert!(
            softirq > 0 && (p != "try_charge" || to_clients * 10 >= softirq * 9),
            "{name}: sockets: {p}: {to_clients} of {softirq} softirq calls charge the clients' memcgs\n{summary}"
        );
        let per_op = workload as f64 / ops.count as f64;
        let softirq_per_op = softirq as f64 / ops.count as f64;
        if p == "try_charge" {
            assert!(
                per_op >= 1.0 && softirq_per_op >= 0.5,
                "{name}: sockets: {per_op:.3} try_charge calls a message, {softirq_per_op:.3} in softirq\n{summary}"
            );
        }
        said.push(format!(
            "{p} ({}, {}) {per_op:.3}/message by the workload, {softirq_per_op:.3} in softirq ({:.1}% of {p}'s calls)",
            pr.target,
            pr.backend,
            100.0 * softirq as f64 / pr.count.max(1) as f64
        ));
    }
    assert!(
        summary.contains("per operation (4000 64 KiB messages): try_charge "),
        "{name}: sockets: the table does not give the calls per message\n{summary}"
    );
    format!("sockets: {}", said.join(", "))
}

/// The sockets workload in a memcg given with `--cgroup`, stopped by `--duration` (the
/// SIGTERM memcg-trace sends): it gives the memcg back as it was, the memory controller off
/// below it again, its sub-memcgs gone and no process left, so a later run there can join it
/// (the kernel refuses a process in a cgroup that hands the memory controller down).
fn check_sockets_stopped(name: &str, out: &Path) {
    let read = |f: &str| fs::read_to_string(out.join(f)).unwrap_or_default();
    let said = read("stopped.txt");
    assert!(
        !read("given-control.txt").contains("memory")
            && read("given-children.txt").trim() == "0"
            && read("given-procs.txt").trim() == "0",
        "{name}: the given memcg after a stopped sockets workload: subtree_control {:?}, {} sockets-* children, {} processes\n{said}",
        read("given-control.txt").trim(),
        read("given-children.txt").trim(),
        read("given-procs.txt").trim()
    );
    assert!(
        !said.contains("not given back"),
        "{name}: the stopped sockets workload did not give its cgroups back\n{said}"
    );
    assert_eq!(
        read("again.status").trim(),
        "0",
        "{name}: a later run in the given memcg failed\n{}",
        read("again.txt")
    );
}

/// `--workload perf-messaging`: perf's copy of hackbench, its messages counted from its own
/// option names (1 group, 20 senders, 20 receivers, 50 loops: 20,000), and at least the
/// charges a message of hackbench with the same options in the same boot (0.9x), at most
/// twice them: the messaging is the same, and perf adds its own start and the forks of its
/// 40 processes from a far larger parent than hackbench's (each fork copies its mappings,
/// accounted objects: measured 3.095 against 2.225 charges a message on 6.12, 2.769 against
/// 2.172 on 7.3, i.e. about 400 charges a fork).
fn check_perf_messaging(name: &str, out: &Path) -> String {
    let mut per_op = Vec::new();
    for (file, unit) in [
        ("hackbench", "hackbench messages"),
        ("perf", "perf messaging messages"),
    ] {
        let doc = load_recording(&out.join(format!("{file}.json")));
        let summary = fs::read_to_string(out.join(format!("{file}.txt"))).expect("summary");
        check_invariants(&doc, &summary);
        let w = doc.meta.workload.as_ref().expect("the workload");
        assert_eq!(w.exit_status, Some(0), "{name}: {file}\n{summary}");
        let o = w.operations.as_ref().expect("the workload's operations");
        assert_eq!((o.count, o.unit.as_str()), (20_000, unit), "{name}: {file}");
        let charged = probe(&doc, "charge")
            .workload
            .as_ref()
            .map_or(0, |w| w.count);
        per_op.push(charged as f64 / o.count as f64);
    }
    let ratio = per_op[1] / per_op[0].max(1e-9);
    assert!(
        per_op[0] > 0.0 && (0.9..=2.0).contains(&ratio),
        "{name}: charges a message: hackbench {:.3}, perf bench sched messaging {:.3}",
        per_op[0],
        per_op[1]
    );
    format!(
        "charges a message: hackbench {:.3}, perf bench sched messaging {:.3}",
        per_op[0], per_op[1]
    )
}

#[test]
fn vm_workloads_6_12() {
    workloads_on("vm_workloads_6_12", "6.12");
}

#[test]
fn vm_workloads_7_3() {
    workloads_on("vm_workloads_7_3", "7.3");
}

/// A workload OOM-killed in its memcg: `record --cgroup` on a memcg of 32 MiB without
/// swap while `tail /dev/zero` grows. memcg-trace exits with the workload's 137 and says why:
/// the recording's OOM kills equal the kernel's own count (`oom_kill` of the memcg's
/// memory.events, read by the guest after the run), and the table's workload line gives the
/// kill beside the exit. A second memcg-trace run on a workload that exits by itself in the
/// same memcg (its earlier kill already counted) says no OOM kill; a workload OOM-killed over
/// and over in a memcg memcg-trace made, stopped by `--duration`, keeps its count (read before
/// the memcg is removed).
#[test]
fn vm_oom_6_12() {
    let name = "vm_oom_6_12";
    let short = "6.12";
    let Some(kernel) = one_kernel(name, short) else {
        return;
    };
    let script = r#"
echo +memory >/sys/fs/cgroup/cgroup.subtree_control
mkdir /sys/fs/cgroup/small
echo 32M >/sys/fs/cgroup/small/memory.max
echo 0 >/sys/fs/cgroup/small/memory.swap.max 2>/dev/null || true
echo "guest: tail /dev/zero in a 32M memcg"
rc=0
memcg-trace record --cgroup /sys/fs/cgroup/small -p charge -o /out/oom.json -- tail /dev/zero >/out/oom.txt 2>/out/oom.err || rc=$?
echo $rc >/out/oom.status
cp /sys/fs/cgroup/small/memory.events /out/memory.events
echo "guest: a workload that ends by itself there"
memcg-trace record --cgroup /sys/fs/cgroup/small -p charge -o /out/after.json -- true >/out/after.txt 2>&1
echo "guest: OOM kills in a memcg memcg-trace made, tracing stopped first"
memcg-trace record -p charge --duration 4s -o /out/stopped.json -- sh -c 'cg=/sys/fs/cgroup$(cut -d: -f3 /proc/self/cgroup); echo 16M >$cg/memory.max; while :; do tail /dev/zero; done' >/out/stopped.txt 2>&1
cat /out/oom.txt /out/oom.err
"#;
    let r = boot(&kernel, format!("{short}-oom"), script.into(), Vec::new());
    let status = fs::read_to_string(r.out_dir.join("oom.status")).expect("status");
    let summary = fs::read_to_string(r.out_dir.join("oom.txt")).expect("summary");
    let events = fs::read_to_string(r.out_dir.join("memory.events")).expect("memory.events");
    let kernel_kills =
        memcg_trace::workload::oom_kill_of(&events).expect("oom_kill in memory.events");
    let doc = load_recording(&r.out_dir.join("oom.json"));
    let w = doc.meta.workload.as_ref().expect("the workload");
    assert!(
        status.trim() == "137" && w.exit_status == Some(137),
        "{name}: memcg-trace exited {}, the workload {:?}\n{summary}",
        status.trim(),
        w.exit_status
    );
    assert!(
        kernel_kills >= 1 && w.oom_kills == Some(kernel_kills),
        "{name}: the kernel counted {kernel_kills} OOM kills, the recording {:?}\n{events}\n{summary}",
        w.oom_kills
    );
    assert!(
        summary.contains(&format!(
            "(exit 137 (SIGKILL); {kernel_kills} OOM kill{} in its memcg)",
            if kernel_kills == 1 { "" } else { "s" }
        )),
        "{name}: the table does not say it was OOM-killed\n{summary}"
    );
    let after = load_recording(&r.out_dir.join("after.json"));
    let wa = after.meta.workload.as_ref().expect("the workload");
    assert_eq!(
        (wa.exit_status, wa.oom_kills),
        (Some(0), Some(0)),
        "{name}: a workload that ended by itself after the kill"
    );
    // Still running when tracing stopped (its memcg removed at the end): the kills so far.
    let stopped = load_recording(&r.out_dir.join("stopped.json"));
    let ws = stopped.meta.workload.as_ref().expect("the workload");
    let ssum = fs::read_to_string(r.out_dir.join("stopped.txt")).expect("summary");
    assert!(
        ws.exit_status.is_none()
            && ws.oom_kills.is_some_and(|k| k >= 1)
            && ssum.contains("(not ended; "),
        "{name}: a workload OOM-killed over and over, stopped by --duration: exit {:?}, {:?} OOM kills\n{ssum}",
        ws.exit_status,
        ws.oom_kills
    );
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        format!(
            "{name}: {}\n",
            summary
                .lines()
                .find(|l| l.starts_with("workload:"))
                .unwrap_or("")
        )
        .as_bytes(),
    );
}

/// Charges that reclaim: a memcg at its memory.max with swap on zram, traced with the
/// `try_charge` probe. The reclaiming calls are timed (latencies far above the fast path's),
/// and none is lost for having slept or been preempted.
#[test]
fn vm_reclaim_6_12() {
    let name = "vm_reclaim_6_12";
    let short = "6.12";
    let Some(kernel) = one_kernel(name, short) else {
        return;
    };
    let modules = kernels::modules(&kernel, &["zram"]).expect("the zram module");
    let r = boot(
        &kernel,
        format!("{short}-reclaim"),
        xtask::reclaim_script("16M", 4),
        modules,
    );
    let doc = load_recording(&r.out_dir.join("reclaim.json"));
    let summary = fs::read_to_string(r.out_dir.join("reclaim.txt")).expect("summary");
    check_invariants(&doc, &summary);
    check_hdr_independently(&r.out_dir.join("reclaim.json"));
    let events = fs::read_to_string(r.out_dir.join("memory.events")).expect("memory.events");
    let hit_max: u64 = events
        .lines()
        .find_map(|l| l.strip_prefix("max "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    assert!(hit_max > 0, "the memcg never reached memory.max:\n{events}");
    let p = probe(&doc, "try_charge");
    let task = &p.contexts[0];
    let l = task.latency.as_ref().expect("try_charge latency");
    let p50 = l.percentiles[0].ns;
    assert!(task.count > 0, "no try_charge call timed: {summary}");
    assert!(
        l.max_ns >= 100 * p50.max(1),
        "no reclaiming call: max {} ns vs p50 {p50} ns",
        l.max_ns
    );
    assert_eq!(
        p.lost,
        0,
        "try_charge calls lost: {}",
        memcg_trace::table::probe_footnote(p)
    );
    // The reclaiming calls slept or were preempted: they are timed wall-clock, and the time
    // they spent off the CPU is told apart from the time on it.
    assert!(
        task.switched > 0 && task.off_cpu_ns > 0 && task.off_cpu_max_ns > 0,
        "no try_charge call left the CPU, or no time off it: {}",
        memcg_trace::table::probe_footnote(p)
    );
    let on_cpu = task.on_cpu_ns.expect("on-CPU time");
    assert!(
        on_cpu > 0 && on_cpu < l.sum_ns,
        "on-CPU {on_cpu} ns of {} ns",
        l.sum_ns
    );
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        format!(
            "{name}: memory.max reached {hit_max} times; try_charge p50 {p50} ns, p99 {} ns, max {} ns; wall {} ns = on-CPU {on_cpu} + off-CPU {} ns; {}\n",
            l.percentiles[2].ns,
            l.max_ns,
            l.sum_ns,
            task.off_cpu_ns,
            memcg_trace::table::probe_footnote(p)
        )
        .as_bytes(),
    );
    // charge (obj_cgroup_charge) calls try_charge_memcg whenever its per-CPU stock of bytes
    // runs out: the files' kernel objects make a thousand or so such calls. They are seen
    // nested: in charge's self time, not outermost (each probe's calls nest in the other's).
    let c = &probe(&doc, "charge").contexts[0];
    let l = c.latency.as_ref().expect("charge latency");
    assert!(
        l.nested_calls.unwrap_or(0) > 0 && l.self_ns.unwrap_or(u64::MAX) < l.sum_ns,
        "no try_charge call seen nested in charge: {:?} nested, self {:?} of {} ns; {}",
        l.nested_calls,
        l.self_ns,
        l.sum_ns,
        memcg_trace::table::probe_footnote(probe(&doc, "charge"))
    );
    let tc = task.latency.as_ref().expect("try_charge latency");
    assert!(
        task.outermost_ns < tc.sum_ns,
        "every try_charge call outermost ({} of {} ns): none seen inside charge",
        task.outermost_ns,
        tc.sum_ns
    );
    {
        // The time the nested try_charge calls spent off the CPU is told apart (review finding
        // 3c), within charge's own.
        let (off, nested_off) = (l.off_cpu_ns.unwrap_or(0), l.nested_off_cpu_ns.unwrap_or(0));
        assert!(
            nested_off <= off,
            "charge: nested calls' time off the CPU {nested_off} ns above its own {off} ns"
        );
        let _ = std::io::Write::write_all(
            &mut std::io::stderr(),
            format!(
                "{name}: charge {} calls, {} nested calls, off the CPU {off} ns, of it in nested try_charge {nested_off} ns\n",
                c.count,
                l.nested_calls.unwrap_or(0)
            )
            .as_bytes(),
        );
    }
}

/// The kernel's own per-call durations: ftrace's function_graph on the probe's function, in
/// the same run as memcg-trace, on two vCPUs (`xtask/guest/oracle.sh`).
struct Fgraph {
    calls: u64,
    max_ns: u64,
    /// (threshold ns, calls at or above it).
    ge: Vec<(u64, u64)>,
    /// Events function_graph's ring buffers lost (overrun + dropped, all CPUs).
    lost: u64,
    /// Calls under 10 us and their summed durations.
    short: (u64, u64),
}

fn fgraph(path: &Path) -> Fgraph {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut f = Fgraph {
        calls: 0,
        max_ns: 0,
        ge: Vec::new(),
        lost: 0,
        short: (0, 0),
    };
    for l in text.lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        let num = |i: usize| w.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        match w.first().copied() {
            Some("calls") => f.calls = num(1),
            Some("max_ns") => f.max_ns = num(1),
            Some("short") => f.short = (num(1), num(2)),
            Some("ge") => f.ge.push((num(1), num(2))),
            Some(c) if c.starts_with("cpu") => f.lost += num(w.len() - 1),
            _ => {}
        }
    }
    f
}

/// The calls of `buckets` whose duration is at or above `ns`, as a range: the buckets wholly at
/// or above it, and those reaching above it.
fn at_least(buckets: &[memcg_trace::export::Bucket], ns: u64) -> (u64, u64) {
    let mut r = (0, 0);
    for b in buckets {
        if b.min_ns >= ns {
            r.0 += b.count;
        }
        if b.max_ns > ns {
            r.1 += b.count;
        }
    }
    r
}

/// function_graph beside memcg-trace on the same function, on 2 vCPUs, both on the workload's
/// calls (function_graph filtered to its tasks, memcg-trace's workload row): hackbench (charge)
/// and the reclaim workload (try_charge: calls that sleep, are preempted and migrate).
///
/// The two windows differ by the instrumentation: with fentry function_graph's holds
/// memcg-trace's (the BPF trampoline runs inside ftrace's hooks); with kprobe, itself an
/// ftrace handler, memcg-trace's holds function_graph's. Which one is wider is measured (the
/// mean duration of the calls under 10 us, each tool's), and then:
/// - counts: memcg-trace's workload calls are the kernel's (at most its lost calls and its
///   interrupt-context calls and 1% more, and the workload shell's first calls fewer);
/// - no made-up slow call: at every threshold the wider window has at least as many calls above
///   it (memcg-trace's lost calls counted in where its window is the wider), and the longest
///   call;
/// - no censored tail: the wider window has at most 3x the windows' ratio as many calls above
///   100 us, 1 ms and 10 ms as the narrower, plus 3 sigma (a stall or an interrupt lands in a
///   window about in proportion to its length, so the wider window sees more of them).
///
/// `charge` and `try_charge`: the functions they resolve to on this kernel with this backend.
///
/// With `flip` the hackbench run is made twice, the second time with function_graph hooking
/// the function after memcg-trace (kprobe: its window then holds memcg-trace's): the calls one
/// tool sees as slower than the other are on the side of whichever window is the wider, both
/// ways round. A tracer that made up slow samples would have them in the narrower window too.
fn oracle_on(name: &str, short: &str, attach: &str, charge: &str, try_charge: &str, flip: bool) {
    // kprobe on a preemptible kernel: the pairs of calls that left the CPU are confirmed in
    // userspace (7.3 in the matrix).
    // Before 6.7 (6.1-rt) by the switch witness.
    let confirm_deferred = attach == "kprobe" && matches!(short, "7.3" | "6.1-rt");
    let Some(kernel) = one_kernel(name, short) else {
        return;
    };
    let modules = kernels::modules(&kernel, &["zram"]).expect("the zram module");
    let hackbench = format!("hackbench charge {charge} fgraph-first hackbench -g 2 -l 60");
    let late = format!("hackbench-late charge {charge} tracer-first hackbench -g 2 -l 60");
    let reclaim = format!("reclaim try_charge {try_charge} fgraph-first reclaim");
    let mut runs = vec![hackbench.as_str(), reclaim.as_str()];
    if flip {
        runs.insert(1, late.as_str());
    }
    // Per run: whether function_graph's window was the wider.
    let mut wider = Vec::new();
    // Pairs of calls that left the CPU proven by the programs or deferred to userspace over
    // the runs, and of them proven (`confirm_deferred`).
    let mut deferred_all = 0;
    let mut proven_all = 0;
    let r = boot_on(
        &kernel,
        format!("{short}-oracle-{attach}"),
        xtask::oracle_script(attach, &runs),
        modules,
        Vec::new(),
        2,
        None,
    );
    let mut report = format!("{name} ({attach}, 2 vCPUs):\n");
    let mut failures = Vec::new();
    for run in runs {
        let (w, probe_name, func) = {
            let mut it = run.split_whitespace();
            (it.next().unwrap(), it.next().unwrap(), it.next().unwrap())
        };
        let doc = load_recording(&r.out_dir.join(format!("oracle-{w}.json")));
        let p = probe(&doc, probe_name);
        // function_graph traced the function memcg-trace resolved the probe to.
        assert_eq!(p.target, func, "{w}: {probe_name} resolved elsewhere");
        let fg = fgraph(&r.out_dir.join(format!("fgraph-{w}.txt")));
        let wl = p.workload.as_ref().expect("the workload row");
        let latency = wl.latency.as_ref().expect("the workload's latencies");
        let ctx = |f: fn(&memcg_trace::export::ContextOut) -> u64| -> u64 {
            p.contexts.iter().map(f).sum()
        };
        let irq: u64 = p
            .contexts
            .iter()
            .filter(|c| c.context != "task")
            .map(|c| c.count)
            .sum();
        let _ = writeln!(
            report,
            "  {w}: {} ({}): function_graph {} calls (lost {}), max {} ns; memcg-trace's workload row {} calls, max {} ns (probe: {} timed, {} lost, {} interrupt-context; switched {}, migrated {}, proven on their CPU {}, deferred {}, rejected {}, ambiguous {}, censored {})",
            p.name,
            p.target,
            fg.calls,
            fg.lost,
            fg.max_ns,
            wl.count,
            latency.max_ns,
            p.count,
            p.lost,
            irq,
            ctx(|c| c.switched),
            ctx(|c| c.migrated),
            ctx(|c| c.proven_on_cpu),
            ctx(|c| c.deferred),
            ctx(|c| c.rejected),
            ctx(|c| c.ambiguous),
            ctx(|c| c.censored),
        );
        // The instrumentation's difference: the mean window of the calls under 10 us, each
        // tool's (memcg-trace's from its buckets' midpoints).
        let (n, sum) =
            latency
                .buckets
                .iter()
                .filter(|b| b.max_ns <= 10_000)
                .fold((0u64, 0f64), |a, b| {
                    (
                        a.0 + b.count,
                        a.1 + b.count as f64 * (b.min_ns + b.max_ns) as f64 / 2.0,
                    )
                });
        let mt_short = sum / n.max(1) as f64;
        let fg_short = fg.short.1 as f64 / fg.short.0.max(1) as f64;
        let ratio = fg_short / mt_short;
        let fg_wider = ratio >= 1.0;
        wider.push((w, fg_wider));
        let _ = writeln!(
            report,
            "    calls under 10 us: mean {fg_short:.0} ns (function_graph) vs {mt_short:.0} ns (memcg-trace): the {} window is {:.2}x the other's",
            if fg_wider { "kernel's" } else { "tracer's" },
            ratio.max(1.0 / ratio)
        );
        let mut rows = Vec::new();
        for &(ns, k) in &fg.ge {
            let (lo, hi) = at_least(&latency.buckets, ns);
            rows.push((ns, k, lo, hi));
            let _ = writeln!(
                report,
                "    >= {ns:>8} ns: function_graph {k:>7}, memcg-trace {lo}..{hi}"
            );
        }
        let mut fail = |what: String| failures.push(format!("{w}: {what}"));
        if fg.lost > 0 {
            fail(format!("function_graph lost {} events", fg.lost));
        }
        if fg.calls == 0 || wl.count == 0 {
            fail("no calls".into());
        }
        // Counts against the kernel's. function_graph starts once the workload's shell has
        // turned it on for itself (26-41 calls later, seen on 5.10 and 6.12); memcg-trace's
        // lost and interrupt-context calls may be the workload's.
        const PREAMBLE: u64 = 200;
        let upper = wl.count + p.lost + irq;
        if fg.calls + PREAMBLE < wl.count || fg.calls > upper + upper / 100 {
            fail(format!(
                "the kernel counted {} calls of the workload, memcg-trace {} (+ {} lost, + {} in interrupts)",
                fg.calls, wl.count, p.lost, irq
            ));
        }
        // Measured: 1.1-1.5 times the ratio of the means (stalls do not land uniformly: the
        // instrumentation's paths end more translation blocks under TCG); 3x leaves twice that.
        let allowed = 3.0 * ratio.max(1.0 / ratio);
        for &(ns, kernel_n, lo, hi) in &rows {
            // The wider window's count above the threshold (at its least) and the narrower's
            // (at its most).
            let (wide, narrow) = if fg_wider {
                (kernel_n, hi)
            } else {
                (lo, kernel_n)
            };
            // memcg-trace's lost calls may be any of the kernel's, the slow ones too; and its
            // row holds the workload shell's calls before function_graph's pid filter took
            // effect, which the kernel's does not.
            // (Measured 26-41 calls; more than 64 is not a preamble.)
            let preamble = wl.count.saturating_sub(fg.calls).min(64);
            let (wide_most, narrow_least) = if fg_wider {
                (kernel_n, lo.saturating_sub(preamble))
            } else {
                (hi + p.lost, kernel_n)
            };
            if narrow_least > wide_most {
                fail(format!(
                    "{narrow_least} calls of {ns} ns or more in the narrower window, {wide_most} in the wider"
                ));
            }
            if ns >= 100_000 {
                let bound = allowed * narrow as f64;
                if wide as f64 > bound + 3.0 * bound.sqrt() + 10.0 {
                    fail(format!(
                        "{wide} calls of {ns} ns or more in the wider window, {narrow} in the narrower: beyond {allowed:.2}x (3x the windows' ratio)"
                    ));
                }
            }
        }
        // On a preemptible kernel kprobe's pairs of calls that left the CPU are proven by the
        // programs where the task never moved off its CPU, the others deferred and confirmed
        // per tick in userspace: the slow calls are those, and a check that rejected them
        // would censor the tail while every count above still held. At most 1% of each run's
        // deferred rejected (none at all where a run has fewer than 100: reclaim had 16,
        // hackbench 524-664, 0 rejected, when first asserted, all deferred then; 9 and 3 of
        // 690 and 569 deferred since the programs prove the others), some calls that left the
        // CPU in reclaim, at least 100 over the boot, and some of them proven by the programs.
        if confirm_deferred {
            let (deferred, rejected, proven) = (
                ctx(|c| c.deferred),
                ctx(|c| c.rejected),
                ctx(|c| c.proven_on_cpu),
            );
            let left = deferred + proven;
            deferred_all += left;
            proven_all += proven;
            if rejected * 100 > deferred || (w == "reclaim" && left == 0) {
                fail(format!(
                    "{proven} calls that left the CPU proven on it, {deferred} deferred to userspace, {rejected} rejected: some, and at most 1% rejected, expected"
                ));
            }
        }
        let (wide_max, narrow_max) = if fg_wider {
            (fg.max_ns, latency.max_ns)
        } else {
            (latency.max_ns, fg.max_ns)
        };
        // (Where memcg-trace is the wider window and lost a call, that call may be the longest.)
        if narrow_max > wide_max && (fg_wider || p.lost == 0) {
            fail(format!(
                "the narrower window's longest call {narrow_max} ns, the wider's {wide_max} ns"
            ));
        }
    }
    if confirm_deferred && (deferred_all < 100 || proven_all == 0) {
        failures.push(format!(
            "{deferred_all} calls that left the CPU proven or deferred to userspace over the runs, {proven_all} of them proven by the programs: at least 100, and some proven, expected"
        ));
    }
    if flip {
        // kprobe's handlers are ftrace's: the hooks registered last are called first, and
        // their window holds the other's.
        let want = [("hackbench", false), ("hackbench-late", true)];
        if !want.iter().all(|w| wider.contains(w)) {
            failures.push(format!(
                "function_graph's window the wider: {wider:?}, expected {want:?} (the tool that hooks the function second is the outer one)"
            ));
        }
    }
    let _ = std::io::Write::write_all(&mut std::io::stderr(), report.as_bytes());
    assert!(
        failures.is_empty(),
        "{}\n{report}\n--- last console lines ({}) ---\n{}",
        failures.join("\n"),
        r.log.display(),
        r.tail(20)
    );
}

#[test]
fn vm_oracle_6_12() {
    oracle_on(
        "vm_oracle_6_12",
        "6.12",
        "fentry",
        "obj_cgroup_charge",
        "try_charge_memcg",
        false,
    );
}

#[test]
fn vm_oracle_5_10() {
    oracle_on(
        "vm_oracle_5_10",
        "5.10",
        "kprobe",
        "obj_cgroup_charge",
        "try_charge",
        false,
    );
}

#[test]
fn vm_oracle_6_1_rt() {
    oracle_on(
        "vm_oracle_6_1_rt",
        "6.1-rt",
        "kprobe",
        "obj_cgroup_charge",
        "try_charge_memcg",
        false,
    );
}

#[test]
fn vm_oracle_7_3() {
    oracle_on(
        "vm_oracle_7_3",
        "7.3",
        "kprobe",
        "__memcg_slab_post_alloc_hook",
        "try_charge_memcg",
        true,
    );
}

/// The A/B workflow end to end on the switch the kmem-accounting debate was about: Debian's
/// 6.12 booted three times as it is and three times with `cgroup.memory=nokmem`, `record
/// --attach auto` under hackbench each time, then `memcg-trace diff A1 A2 A3 -- B1 B2 B3`
/// (with two a side and B without spread, Welch's test has one degree of freedom: too weak to
/// call even a change to 0 beyond 5% noise). With kmem accounting
/// off, `obj_cgroup_charge` is never called: its calls per hackbench message drop to 0, beyond
/// the noise; page charging goes on (`rstat` still has calls on both sides). The verdict is
/// held on calls/op, which counts and does not time: under emulation a boot's calls/s moved by
/// 40% (13.2k, 12.8k, 24.9k over three boots: Welch's p 0.051 against a change to exactly 0),
/// while the calls a hackbench message makes do not depend on how fast the emulator ran. The
/// rates are held to their direction only.
#[test]
fn vm_compare_kmem_6_12() {
    let name = "vm_compare_kmem_6_12";
    let short = "6.12";
    let Some(kernel) = one_kernel(name, short) else {
        return;
    };
    let out = xtask::workspace_root().join("target/vm/compare-test");
    let _ = fs::remove_dir_all(&out);
    let runs = xtask::compare::kmem_runs(
        &kernel,
        &[
            bin(),
            memcg_trace::workload::hackbench().expect("hackbench (rt-tests)"),
        ],
        3,
        "-g 2 -l 50",
        accel(),
        &out,
    )
    .unwrap_or_else(|e| panic!("{e:#}"));
    for f in runs.a.iter().chain(&runs.b) {
        load_recording(f);
    }
    let diff = |format: &str| diff_of(&runs, format);
    let json: serde_json::Value = serde_json::from_str(&diff("json")).unwrap();
    let figs = json["figures"].as_array().unwrap();
    let find = |probe: &str, ctx: &str, fig: &str| {
        figs.iter()
            .find(|x| x["probe"] == probe && x["context"] == ctx && x["figure"] == fig)
            .unwrap_or_else(|| panic!("{probe} {ctx} {fig} missing: {json}"))
    };
    let rate = find("charge", "task", "calls/s");
    let runs = |side: &str| -> Vec<f64> {
        rate[side]["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect()
    };
    assert!(runs("a").iter().all(|&r| r > 0.0), "{rate}");
    assert!(runs("b").iter().all(|&r| r == 0.0), "{rate}");
    // The workload's own calls per message.
    let per_op = find("charge", "workload", "calls/op");
    assert!(per_op["a"]["mean"].as_f64().unwrap() > 0.0, "{per_op}");
    assert_eq!(per_op["b"]["mean"].as_f64(), Some(0.0), "{per_op}");
    assert_eq!(per_op["beyond_noise"], true, "{per_op}");
    let rstat = find("rstat", "task", "calls/s");
    assert!(
        rstat["a"]["mean"].as_f64().unwrap() > 0.0 && rstat["b"]["mean"].as_f64().unwrap() > 0.0,
        "{rstat}"
    );
    let dur = find("run", "-", "duration");
    assert_eq!(
        (dur["a"]["n"].as_u64(), dur["b"]["n"].as_u64()),
        (Some(3), Some(3))
    );
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        format!("{name}:\n{}", diff("table")).as_bytes(),
    );
}

/// `memcg-trace diff --format FORMAT` of the two sides' recordings; fails the test if diff does.
fn diff_of(runs: &xtask::compare::KmemRuns, format: &str) -> String {
    let o = std::process::Command::new(bin())
        .args(["diff", "--format", format])
        .args(&runs.a)
        .arg("--")
        .args(&runs.b)
        .output()
        .expect("run memcg-trace diff");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).expect("diff's output is UTF-8")
}

/// One kernel against another (`cargo xtask demo --compare --a A --b B`): both booted
/// alternately, two runs each, and `memcg-trace diff` of the recordings. Each side's runs are
/// its kernel; every default probe has its calls per hackbench message on both sides, and that
/// figure repeats within a side (the work per message is the kernel's, not the run's); a probe
/// whose function (or backend: `auto` decides per kernel) differs between the kernels says so
/// on its rows, naming both, and a probe where they stayed says nothing. The verdicts the runs
/// alone decide are checked (`verdict_from_runs`).
fn compare_kernels(name: &str, a: &str, b: &str, functions_change: bool) {
    let (Some(ka), Some(kb)) = (one_kernel(name, a), one_kernel(name, b)) else {
        return;
    };
    let out = xtask::workspace_root().join(format!("target/vm/compare-{a}-{b}-test"));
    let _ = fs::remove_dir_all(&out);
    let runs = xtask::compare::ab_runs(
        [("a", &ka), ("b", &kb)],
        &[
            bin(),
            memcg_trace::workload::hackbench().expect("hackbench (rt-tests)"),
        ],
        2,
        "-g 1 -l 50",
        accel(),
        &out,
    )
    .unwrap_or_else(|e| panic!("{name}: {e:#}"));
    let docs = |files: &[std::path::PathBuf]| -> Vec<memcg_trace::export::Document> {
        files.iter().map(|f| load_recording(f)).collect()
    };
    let (da, db) = (docs(&runs.a), docs(&runs.b));
    for (d, k) in da
        .iter()
        .map(|d| (d, &ka))
        .chain(db.iter().map(|d| (d, &kb)))
    {
        assert_eq!(
            d.meta.kernel_release, k.release,
            "{name}: a run of the wrong kernel"
        );
    }
    let json: serde_json::Value = serde_json::from_str(&diff_of(&runs, "json")).unwrap();
    let table = diff_of(&runs, "table");
    let figs = json["figures"].as_array().unwrap();
    let mut changed = Vec::new();
    // (beyond noise, the row) where the runs alone decide it (`verdict_from_runs`).
    let mut verdicts = Vec::new();
    for p in DEFAULT_PROBES {
        let target = |d: &memcg_trace::export::Document| probe(d, p).target.clone();
        let (ta, tb) = (target(&da[0]), target(&db[0]));
        let rows: Vec<&serde_json::Value> = figs.iter().filter(|f| f["probe"] == p).collect();
        assert!(!rows.is_empty(), "{name}: no row of {p}\n{table}");
        let said = format!("{}: {ta} -> {}: {tb}", ka.release, kb.release);
        // `auto` may take another backend on the other kernel (kprobe on preemptible 7.3).
        let backend = |d: &memcg_trace::export::Document| probe(d, p).backend.to_string();
        let (ba, bb) = (backend(&da[0]), backend(&db[0]));
        for r in &rows {
            if ta == tb {
                assert!(
                    r.get("functions").is_none(),
                    "{name}: {p} ({ta} on both) says: {r}"
                );
            } else {
                assert_eq!(
                    r["functions"].as_str(),
                    Some(said.as_str()),
                    "{name}: {p}: {r}"
                );
            }
            if ba == bb {
                assert!(
                    r.get("backends").is_none(),
                    "{name}: {p} ({ba} on both) says: {r}"
                );
            } else {
                assert_eq!(
                    r["backends"].as_str(),
                    Some(format!("{ba} -> {bb}").as_str()),
                    "{name}: {p}: {r}"
                );
            }
        }
        if ta != tb {
            assert!(
                table.contains(&format!("* {p}: {said}")),
                "{name}: the table does not say {p}'s function changed\n{table}"
            );
            changed.push(said.clone());
        }
        let per_op = rows
            .iter()
            .find(|r| r["context"] == "workload" && r["figure"] == "calls/op")
            .unwrap_or_else(|| panic!("{name}: {p}: no calls/op row\n{table}"));
        for side in ["a", "b"] {
            let s = &per_op[side];
            assert!(
                s["n"].as_u64() == Some(2) && s["mean"].as_f64().unwrap_or(0.0) > 0.0,
                "{name}: {p} calls/op, side {side}: {per_op}"
            );
        }
        if p == "charge" {
            // The kmem charges of a hackbench message repeat run to run on one kernel.
            for side in ["a", "b"] {
                let rsd = per_op[side]["rsd"].as_f64().unwrap_or(1.0);
                assert!(
                    rsd <= 0.05,
                    "{name}: charge calls/op side {side} rsd {rsd}: {per_op}"
                );
            }
        }
        for r in &rows {
            if let Some(v) = verdict_from_runs(r) {
                // (Not beyond noise: "within noise", or no verdict where nothing spreads.)
                assert_eq!(
                    r["beyond_noise"].as_bool() == Some(true),
                    v,
                    "{name}: {p}: the verdict is not what the runs say\n{r}\n{table}"
                );
                verdicts.push((v, format!("{p} {} {}", r["context"], r["figure"])));
            }
        }
    }
    // Some rows were decided by their runs. (A change that is not to zero, where the runs
    // repeat exactly on each side, is among them: 6.1 -> 6.12's charge calls per message,
    // 2.168 -> 2.225 in every run; not required, as one charge more in one run makes it
    // Welch's to decide.)
    assert!(
        verdicts.iter().any(|v| !v.0),
        "{name}: no row the runs alone decide: {verdicts:?}\n{table}"
    );
    let told: Vec<&String> = verdicts.iter().filter(|v| v.0).map(|v| &v.1).collect();
    // 6.1 and 6.12 trace the same three functions; 7.3 moved all three.
    assert_eq!(
        !changed.is_empty(),
        functions_change,
        "{name}: functions changed between {} and {}: {changed:?}\n{table}",
        ka.release,
        kb.release
    );
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        format!(
            "{name}: functions changed: {}; {} rows decided by their runs, beyond noise: {told:?}\n{table}",
            changed.join("; "),
            verdicts.len()
        )
        .as_bytes(),
    );
}

/// The verdict a row of `diff` must have where its runs alone decide it, two runs a side
/// (the review's 12d: the kmem A/B only tries a change to exactly zero):
/// - the two sides' ranges overlap: within noise. Their means are then at most half the two
///   ranges apart, and each side's standard error is half its range, so Welch's t is at most
///   (ra + rb) / sqrt(ra^2 + rb^2) <= sqrt(2): p > 0.29 at the 1 to 2 degrees of freedom of two
///   runs a side, before any correction for the number of rows (which only raises it);
/// - every run the same on each side and the sides differ, in calls (per second or per
///   operation): beyond noise, as no spread at all is (latencies read from buckets can
///   repeat exactly without telling anything).
///
/// Some(whether beyond noise), or None where the spread and the correction decide.
fn verdict_from_runs(row: &serde_json::Value) -> Option<bool> {
    let runs = |side: &str| -> Option<Vec<f64>> {
        row[side]["runs"]
            .as_array()?
            .iter()
            .map(|v| v.as_f64())
            .collect()
    };
    let (a, b) = (runs("a")?, runs("b")?);
    if a.len() != 2 || b.len() != 2 {
        return None;
    }
    let range = |v: &[f64]| (v[0].min(v[1]), v[0].max(v[1]));
    let ((alo, ahi), (blo, bhi)) = (range(&a), range(&b));
    if alo <= bhi && blo <= ahi {
        return Some(false);
    }
    let calls = matches!(row["figure"].as_str(), Some("calls/s" | "calls/op"));
    (calls && alo == ahi && blo == bhi).then_some(true)
}

#[test]
fn vm_compare_kernels_6_1_6_12() {
    compare_kernels("vm_compare_kernels_6_1_6_12", "6.1", "6.12", false);
}

#[test]
fn vm_compare_kernels_6_12_7_3() {
    compare_kernels("vm_compare_kernels_6_12_7_3", "6.12", "7.3", true);
}

/// `--callers` with fentry and with kprobe: every timed call is under a call site or the
/// "other" row (their calls add up to the context's timed calls exactly, their time to its
/// time), every site is named after a text symbol of the running kernel (none "unknown": the
/// return address was found in every trampoline and kprobe frame), and each probe has more
/// than one caller.
fn callers_on(name: &str, short: &str) {
    let Some(kernel) = one_kernel(name, short) else {
        return;
    };
    let r = boot(
        &kernel,
        format!("{short}-callers"),
        xtask::callers_script(),
        Vec::new(),
    );
    let text: std::collections::HashSet<String> =
        fs::read_to_string(r.out_dir.join("kallsyms-text"))
            .expect("the guest's kallsyms")
            .lines()
            .filter_map(|l| l.split_whitespace().nth(2).map(str::to_string))
            .collect();
    assert!(text.len() > 10_000, "kallsyms: {} text symbols", text.len());
    // The kernel's own call graph, from the image the guest booted.
    let graph = memcg_trace_tests::callgraph::CallGraph::new(
        memcg_trace_tests::callgraph::vmlinux(&kernel.vmlinuz).expect("the kernel image"),
        &fs::read_to_string(r.out_dir.join("kallsyms-text")).unwrap(),
    )
    .expect("the call graph");
    let mut report = String::new();
    // The functions of each probe's main task-context sites (5% of its calls or more), per
    // backend: the two read the return address in different ways and must find the same.
    let mut main_sites: Vec<(String, std::collections::BTreeSet<String>)> = Vec::new();
    for backend in ["fentry", "kprobe"] {
        let doc = load_recording(&r.out_dir.join(format!("callers-{backend}.json")));
        // --callers needs the general programs, not the lean ones (tracer::lean_programs).
        for p in &doc.probes {
            assert!(
                p.programs.iter().all(|g| !g.name.contains("lean")),
                "{short} {backend} --callers {}: {:?}",
                p.name,
                p.programs.iter().map(|g| &g.name).collect::<Vec<_>>()
            );
        }
        // The kernel's own call graph: every call of the stat function updates rstat first
        // thing (memcg_rstat_updated), so rstat's calls from that function are the stat
        // probe's calls, up to what either lost and the calls cut by the window's edges.
        let stat = probe(&doc, "stat");
        let rstat = probe(&doc, "rstat");
        let from_stat: u64 = rstat
            .callers
            .iter()
            .filter(|s| s.site.split('+').next() == Some(stat.target.as_str()))
            .map(|s| s.calls)
            .sum();
        let slack = stat.lost_upper + rstat.lost_upper + stat.count / 100 + 10;
        assert!(
            from_stat.abs_diff(stat.count) <= slack,
            "{backend}: rstat calls from {} {from_stat}, stat calls {} (slack {slack})",
            stat.target,
            stat.count
        );
        report.push_str(&format!(
            "{backend}: rstat from {} {from_stat} calls, stat {}; ",
            stat.target, stat.count
        ));
        for p in &doc.probes {
            assert_eq!(p.backend.to_string(), backend, "{}", p.name);
            for c in &p.contexts {
                let sites: Vec<_> = p
                    .callers
                    .iter()
                    .filter(|s| s.context == c.context)
                    .collect();
                let calls: u64 = sites.iter().map(|s| s.calls).sum();
                let ns: u64 = sites.iter().map(|s| s.sum_ns).sum();
                assert_eq!(
                    calls + c.callers_other,
                    c.count,
                    "{backend} {} {}: sites {calls} + other {} vs {} timed calls",
                    p.name,
                    c.context,
                    c.callers_other,
                    c.count
                );
                let timed_ns = c.latency.as_ref().map_or(0, |l| l.sum_ns);
                // The "other" row has no time: equal without one, at most with one.
                assert!(
                    ns == timed_ns || (c.callers_other > 0 && ns < timed_ns),
                    "{backend} {} {}: time {ns} vs {timed_ns}",
                    p.name,
                    c.context
                );
            }
            for s in &p.callers {
                let func = s.site.split('+').next().unwrap_or("");
                assert!(
                    text.contains(func),
                    "{backend} {}: site {} ({}, {} calls) is not a text symbol of the kernel",
                    p.name,
                    s.site,
                    s.address,
                    s.calls
                );
            }
            // Every site checked against the call graph: the instruction before the return
            // address calls the traced function, or a function that tail-jumps to it; and it
            // is inside the function the site is named after.
            let known = graph.callers_of(&p.target);
            assert!(
                !known.direct.is_empty(),
                "{backend} {}: no caller of {} in the kernel image",
                p.name,
                p.target
            );
            let all: u64 = p.callers.iter().map(|s| s.calls).sum();
            let mut unproven = Vec::new();
            let mut unproven_main = 0;
            let mut proven = 0;
            for s in &p.callers {
                let ret = u64::from_str_radix(s.address.trim_start_matches("0x"), 16).unwrap();
                let named = graph.function_at(ret).map(|f| f.1.to_string());
                assert_eq!(
                    named.as_deref(),
                    s.site.split('+').next(),
                    "{backend} {}: site {} at {}",
                    p.name,
                    s.site,
                    s.address
                );
                match graph.site_of(&known, ret) {
                    Some(_) => proven += s.calls,
                    None => {
                        unproven.push(format!("{} ({} calls)", s.site, s.calls));
                        unproven_main += usize::from(s.calls * 100 >= all);
                    }
                }
            }
            // Every site with 1% of the calls or more; 99.9% of all calls.
            assert!(
                unproven_main == 0 && proven * 1000 >= all * 999,
                "{backend} {}: sites not a call of {} (nor of a function tail-jumping to it) in the kernel's code: {unproven:?}",
                p.name,
                p.target
            );
            if p.name == "stat" || p.name == "rstat" {
                let seen: BTreeSet<&str> = p
                    .callers
                    .iter()
                    .filter_map(|s| s.site.split('+').next())
                    .filter(|f| known.direct.contains(*f))
                    .collect();
                report.push_str(&format!(
                    "{backend} {}: {} of the {} direct callers of {} in the image seen; ",
                    p.name,
                    seen.len(),
                    known.direct.len(),
                    p.target
                ));
            }
            let task: Vec<_> = p.callers.iter().filter(|s| s.context == "task").collect();
            main_sites.push((
                format!("{backend} {}", p.name),
                task.iter()
                    .filter(|s| s.share_of_calls.unwrap_or(0.0) >= 0.05)
                    .map(|s| s.site.clone())
                    .collect(),
            ));
            assert!(
                task.len() >= 2,
                "{backend} {}: task-context call sites {:?}",
                p.name,
                task.iter().map(|s| &s.site).collect::<Vec<_>>()
            );
            let top: Vec<String> = task
                .iter()
                .take(5)
                .map(|s| {
                    format!(
                        "{} {:.1}% of calls, {:.1}% of time",
                        s.site,
                        s.share_of_calls.unwrap_or(0.0) * 100.0,
                        s.share_of_time.unwrap_or(0.0) * 100.0
                    )
                })
                .collect();
            report.push_str(&format!(
                "{backend} {} ({} sites): {}; ",
                p.name,
                p.callers.len(),
                top.join(", ")
            ));
        }
    }
    // Short stacks (`--callers-depth 4`, every entry sampled): each starts at a reported site
    // of its probe and context; each sampled entry is under one stack (their counts add up to
    // the entries); and each frame above the site is, in the kernel's own code, the return
    // address of a call of the function holding the frame below it (directly or through a
    // function that tail-jumps to it; or an indirect call, whose target the image cannot
    // name), the tracer's own frames left out.
    for backend in ["fentry", "kprobe"] {
        let doc = load_recording(&r.out_dir.join(format!("stacks-{backend}.json")));
        let text =
            fs::read_to_string(r.out_dir.join(format!("stacks-{backend}.txt"))).unwrap_or_default();
        check_invariants(&doc, &text);
        for p in &doc.probes {
            assert_eq!(p.stack_sample, Some(1), "{backend} {}", p.name);
            let (mut links, mut proven, mut indirect) = (0u64, 0u64, 0u64);
            let (mut unwound_not, mut all) = (0u64, 0u64);
            let mut wrong = Vec::new();
            for c in &p.contexts {
                let stacks: Vec<_> = p.stacks.iter().filter(|s| s.context == c.context).collect();
                let sampled: u64 = stacks.iter().map(|s| s.sampled).sum();
                assert_eq!(
                    sampled, c.entries,
                    "{backend} {} {}: stacks hold {sampled} sampled entries, {} entries",
                    p.name, c.context, c.entries
                );
                for s in stacks {
                    all += s.sampled;
                    assert!(
                        p.callers
                            .iter()
                            .any(|x| x.context == s.context && x.site == s.frames[0]),
                        "{backend} {} {}: stack {:?} starts at no reported site",
                        p.name,
                        s.context,
                        s.frames
                    );
                    if s.frames.get(1).map(String::as_str) == Some("(not unwound)") {
                        unwound_not += s.sampled;
                        continue;
                    }
                    let addrs: Vec<u64> = s
                        .addresses
                        .iter()
                        .map(|a| u64::from_str_radix(a.trim_start_matches("0x"), 16).unwrap())
                        .collect();
                    for w in addrs.windows(2) {
                        links += s.sampled;
                        let callee = graph.function_at(w[0]).map_or(0, |f| f.0);
                        match graph.link(w[1], callee) {
                            Link::Direct | Link::Tail => proven += s.sampled,
                            Link::Indirect => indirect += s.sampled,
                            Link::Wrong => {
                                wrong.push(format!("{:?} ({} sampled)", s.frames, s.sampled))
                            }
                        }
                    }
                }
            }
            // Indirect calls (through a function pointer: the image cannot say which) are
            // calls still, but most links must be proven.
            assert!(
                unwound_not * 100 <= all
                    && (proven + indirect) * 100 >= links * 99
                    && proven * 2 >= links,
                "{backend} {}: {unwound_not} of {all} sampled entries not unwound; frames proven {proven}, indirect {indirect} of {links}: {wrong:?}",
                p.name
            );
            if p.name == "stat" {
                let top: Vec<String> = p
                    .stacks
                    .iter()
                    .filter(|s| s.context == "task")
                    .take(3)
                    .map(|s| {
                        format!(
                            "{:.0}% {}",
                            s.share.unwrap_or(0.0) * 100.0,
                            s.frames.join(" <- ")
                        )
                    })
                    .collect();
                report.push_str(&format!("{backend} stat stacks: {}; ", top.join(" | ")));
            }
        }
    }
    let (fentry, kprobe) = main_sites.split_at(main_sites.len() / 2);
    for ((fa, a), (kb, b)) in fentry.iter().zip(kprobe) {
        // A site just around 5% in one run may fall just under it in the other: each main
        // site of one must be a site of the other at all, and most must be main in both.
        let common = a.intersection(b).count();
        assert!(
            common * 2 > a.len().max(b.len()),
            "{fa}: main sites {a:?}; {kb}: {b:?}"
        );
    }
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        format!("{name}: {report}\n").as_bytes(),
    );
}

#[test]
fn vm_callers_6_12() {
    callers_on("vm_callers_6_12", "6.12");
}

#[test]
fn vm_callers_7_3() {
    callers_on("vm_callers_7_3", "7.3");
}

/// `--by-memcg` with fentry and with kprobe on cgroup v2: hackbench in memcg A (the
/// workload's `--cgroup`) and three times as much in memcg B, at once. For every probe, each
/// call is under the memcg it charges, read from the function's own argument (an obj_cgroup,
/// a mem_cgroup, a cgroup or css): per context the rows add up to the calls (the invariants),
/// none is unknown, A and B are named by their paths and B has two to five times A's task
/// calls; interrupt-context calls charging A or B are seen; the workload's row is exactly the
/// calls charging A, in every context. Then, in the same run, a small hackbench in memcg D1,
/// which is then removed, and the same in D2 made after it: each has its calls on its own id,
/// within 2x of the other's (the per-CPU memo of the chase must not outlive D1).
fn by_memcg_on(name: &str, short: &str) {
    let Some(kernel) = one_kernel(name, short) else {
        return;
    };
    let r = boot(
        &kernel,
        format!("{short}-bymemcg"),
        xtask::bymemcg_script(),
        Vec::new(),
    );
    let ids: std::collections::HashMap<String, u64> =
        fs::read_to_string(r.out_dir.join("bymemcg-ids"))
            .expect("the guest's cgroup ids")
            .lines()
            .filter_map(|l| {
                let (id, path) = l.split_once(' ')?;
                Some((
                    path.trim_start_matches("/sys/fs/cgroup").to_string(),
                    id.parse().ok()?,
                ))
            })
            .collect();
    let (a, b) = (ids["/A"], ids["/B"]);
    // Per backend: the ids of the memcgs made and removed during its run ("fentry/D1", ...).
    let mut churn: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
    for backend in ["fentry", "kprobe"] {
        let ids_file = r.out_dir.join(format!("bymemcg-ids-{backend}"));
        for l in fs::read_to_string(&ids_file)
            .unwrap_or_else(|e| panic!("{}: {e}", ids_file.display()))
            .lines()
        {
            if let Some((id, path)) = l.split_once(' ') {
                let memcg = path.trim_start_matches("/sys/fs/cgroup/");
                churn.insert(
                    format!("{backend}/{memcg}"),
                    id.parse().expect("a cgroup id"),
                );
            }
        }
    }
    let mut report = String::new();
    for backend in ["fentry", "kprobe"] {
        let path = r.out_dir.join(format!("bymemcg-{backend}.json"));
        let doc = load_recording(&path);
        let text = fs::read_to_string(r.out_dir.join(format!("bymemcg-{backend}.txt")))
            .unwrap_or_default();
        check_invariants(&doc, &text);
        assert!(
            doc.meta.workload.as_ref().is_some_and(|w| w.by_memcg),
            "{backend}: {:?}",
            doc.meta.workload
        );
        let mut irq = 0;
        let mut read = 0;
        for p in &doc.probes {
            assert_eq!(p.backend.to_string(), backend, "{}", p.name);
            let calls = |id: u64, ctx: Option<&str>| -> u64 {
                p.memcgs
                    .iter()
                    .filter(|m| m.id == id && ctx.is_none_or(|c| m.context == c))
                    .map(|m| m.calls)
                    .sum()
            };
            // A function whose first argument leads to no memcg (7.3's charge step takes a
            // kmem_cache) says so, and all its calls are under "unknown".
            if p.notes
                .iter()
                .any(|n| n.contains("charged memcg is not read"))
            {
                assert_eq!(calls(0, None), p.count, "{backend} {}: not read", p.name);
                report.push_str(&format!("{backend} {}: not read ({}); ", p.name, p.target));
                continue;
            }
            read += 1;
            // Other controllers' updates (rstat is shared: cpu time, io) are told apart, and
            // only where the argument is a cgroup or css.
            let other = calls(memcg_trace_common::NOT_A_MEMCG, None);
            assert!(
                other == 0 || p.name == "rstat",
                "{backend} {}: {other} calls of another controller",
                p.name
            );
            let unknown = calls(0, None);
            assert_eq!(
                unknown, 0,
                "{backend} {}: calls whose memcg was not read",
                p.name
            );
            for m in p.memcgs.iter().filter(|m| m.id == a || m.id == b) {
                let want = if m.id == a { "/A" } else { "/B" };
                assert_eq!(m.cgroup, want, "{backend} {}: id {}", p.name, m.id);
            }
            let (ta, tb) = (calls(a, Some("task")), calls(b, Some("task")));
            // B's hackbench runs three times A's loops, but both fork and reap as many tasks,
            // whose charges do not scale with the loops: B's share is between 1.5x (1.9x seen
            // for stat on 7.3) and 5x A's, never A's or below (calls put on the wrong memcg).
            assert!(
                ta > 0 && 2 * tb > 3 * ta && tb < 5 * ta,
                "{backend} {}: task-context calls charging A {ta}, B {tb} (B ran three times A's hackbench)\n{text}",
                p.name
            );
            irq += calls(a, None) + calls(b, None) - ta - tb;
            let own = p.workload.as_ref().map_or(0, |w| w.count);
            assert_eq!(
                own,
                calls(a, None),
                "{backend} {}: the workload's calls are those charging A\n{text}",
                p.name
            );
            // The same hackbench in D1, removed, then in D2 made after it, in the run: each
            // memcg's calls on its own id (a memo of the chase kept past D1's removal, with D2
            // at D1's addresses, would put D2's on D1's id), about as many each.
            let (d1, d2) = (
                churn[&format!("{backend}/D1")],
                churn[&format!("{backend}/D2")],
            );
            let (t1, t2) = (calls(d1, Some("task")), calls(d2, Some("task")));
            assert!(
                t1 > 0 && t2 > 0 && t2 < 2 * t1 && t1 < 2 * t2,
                "{backend} {}: task-context calls charging D1 {t1}, D2 {t2} (the same hackbench, D2 made after D1 was removed)\n{text}",
                p.name
            );
            report.push_str(&format!(
                "{backend} {}: A {ta} task / {} all, B {tb} task / {} all, D1 {t1}, D2 {t2} task, {} memcgs, {other} calls of another controller; ",
                p.name,
                calls(a, None),
                calls(b, None),
                p.memcgs.len()
            ));
        }
        assert!(
            irq > 0,
            "{backend}: no interrupt-context call charging A or B\n{text}"
        );
        assert!(read >= 2, "{backend}: the memcg read for {read} probes");
        report.push_str(&format!("{backend} interrupt contexts {irq}; "));
    }
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        format!("{name}: {report}\n").as_bytes(),
    );
}

#[test]
fn vm_by_memcg_6_12() {
    by_memcg_on("vm_by_memcg_6_12", "6.12");
}

#[test]
fn vm_by_memcg_7_3() {
    by_memcg_on("vm_by_memcg_7_3", "7.3");
}

/// The workload's CPU shares against a profiler (issue "Where the workload's CPU goes"):
/// hackbench in memcg-trace's fresh memcg with the charge probe alone (fentry, then kprobe),
/// while perf samples every CPU in the same run (software clock, kernel callchains; the guest
/// script classifies each sample of the workload's tasks: in the instrumentation if a BPF
/// program or trampoline or the ftrace/kprobe machinery is reached before any traced function
/// on its chain, else in the traced function if its chain holds it; each sample weighs the
/// time since the previous one on its CPU); then the same recording without perf.
///
/// The VM is set up so that both tools see the same time: one vCPU (two would take turns on
/// QEMU's one thread, and a vCPU waiting for its turn sees time pass inside calls) and, under
/// TCG, a guest clock that counts instructions (`-icount shift=0`: 1 ns each), so that the
/// instrumentation inside the timed window costs the instructions the floor's tight loop
/// counts (host-clocked, it cost 3-4x more in place: QEMU's software TLB and code cache).
/// Under KVM the clock is the host's and the floor's spread widens the tolerance.
///
/// Checks:
/// - perf's time of the workload is the cgroup's CPU usage memcg-trace divides by (within 5%:
///   samples near the workload's start and end, the shell before it execs hackbench);
/// - **memcg-trace's self share less the instrumentation inside it (the floor per call), in
///   the run without perf, lies within perf's shares of the function at two sampling rates
///   (4,000 and 10,000 Hz, a run each), each widened by 4 of its standard errors (binomial
///   over the effective number of weighted samples, widened where batches of consecutive
///   samples vary more than that), plus the floor's spread (p90 - p50 per call) plus one
///   context switch's cost (`perf bench sched pipe` in the same boot) for each call that left
///   the CPU (see below)**. Two rates because under the counted clock perf's share moves with
///   its rate and from boot to boot by more than its sampling error (fentry on 6.12: 1.42-1.98%
///   at 4,000 Hz, 1.82-2.17% at 10,000, where memcg-trace reads 1.47-1.51%; kprobe 0.89-1.61%,
///   memcg-trace 1.23-1.28%).
///   Without perf: its sampling interrupts land in the timed windows in proportion to their
///   time, and the floor, measured without them, does not take them out (beside perf the self
///   share less the floor came out 0.4-1.0 points higher);
/// - beside perf, memcg-trace's total share is at least perf's lowest function share plus
///   the floor's share, and at most perf's highest function share plus all the
///   instrumentation perf saw in that run (4 sigma each way);
/// - **where two backends trace the function (6.12), its own time per call (self less the
///   floor, the median of three runs without perf each) is the same by both within 5%**: the function's
///   instructions do not depend on how it is traced, the instrumentation taken out differs
///   2.5x, and this resolves a few instructions a call where perf resolves tens (66.6-66.7 ns
///   by fentry, 65.1-65.2 by kprobe in three runs each in one boot, with the floor measured
///   on the traced slot's code).
///
/// Only charge is compared: perf's clock cannot interrupt code that runs with interrupts off
/// (the stat and rstat functions), so their samples land at the interrupt-enable point in a
/// caller.
fn profile_on(name: &str, short: &str) {
    let Some(kernel) = one_kernel(name, short) else {
        return;
    };
    let Ok(perf) = xtask::which("perf") else {
        skip(name, "perf (linux-perf) is missing");
        return;
    };
    // fentry loses most calls on preemptible kernels (what `auto` avoids), and a lost call's
    // time is in nobody's share: there, kprobe only.
    let backends: &[&str] = if short == "7.3" {
        &["kprobe"]
    } else {
        &["fentry", "kprobe"]
    };
    // Rounds without perf where two backends are compared (one is enough for the checks
    // against perf).
    let rounds = if backends.len() > 1 {
        PROFILE_ALONE_ROUNDS
    } else {
        1
    };
    let r = boot_on(
        &kernel,
        format!("{short}-profile"),
        xtask::profile_script(
            &backends.join(" "),
            "--probe charge",
            PROFILE_HACKBENCH,
            &PROFILE_FREQS,
            rounds,
        ),
        Vec::new(),
        vec![perf],
        1,
        Some(0),
    );
    let switch_ns: f64 = fs::read_to_string(r.out_dir.join("switch-ns.txt"))
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .expect("the cost of a context switch (perf bench sched pipe)");
    let mut report = String::new();
    // The function's own time per call (self less the instrumentation: instructions under
    // the counted clock) by backend, from the runs without perf.
    let mut per_call: Vec<(&str, f64)> = Vec::new();
    let mut details: Vec<String> = Vec::new();
    for &backend in backends {
        // memcg-trace's side, from the recordings without perf beside it: perf's sampling
        // interrupts land inside the timed windows in proportion to their time, and the
        // floor (measured without them) does not take them out. Of the rounds, the one whose
        // own time per call is the median stands for the backend.
        let mut runs: Vec<(f64, memcg_trace::export::Document)> = (1..=rounds)
            .map(|i| {
                let alone = load_recording(&r.out_dir.join(format!("alone-{backend}-{i}.json")));
                let text = fs::read_to_string(r.out_dir.join(format!("alone-{backend}-{i}.txt")))
                    .unwrap_or_default();
                check_invariants(&alone, &text);
                (own_ns_per_call(&alone), alone)
            })
            .collect();
        runs.sort_by(|a, b| a.0.total_cmp(&b.0));
        let round_figures: Vec<String> = runs.iter().map(|(ns, _)| format!("{ns:.1}")).collect();
        // What each run's figure is made of, for the message should the backends disagree
        // (one boot in nine of the full test read kprobe 58.6 ns against fentry 66.8, its
        // rounds not kept): the self time, the floor taken out, the calls and CPU.
        details.push(format!(
            "{backend}: {}",
            runs.iter()
                .map(|(ns, d)| {
                    let p = &d.probes[0];
                    let w = p.workload.as_ref();
                    let floor = d.meta.floor(p.backend);
                    format!(
                        "{ns:.1} ns (self {} ns over {} calls, floor p50 {} p90 {} min {} ns, workload CPU {} ns, {} left the CPU)",
                        w.and_then(|w| w.latency.as_ref()).and_then(|l| l.self_ns).unwrap_or(0),
                        w.map_or(0, |w| w.count),
                        floor.map_or(0, |f| f.p50_ns),
                        floor.map_or(0, |f| f.p90_ns),
                        floor.map_or(0, |f| f.min_ns),
                        d.meta.workload.as_ref().and_then(|w| w.cpu_ns).unwrap_or(0),
                        p.contexts[0].switched,
                    )
                })
                .collect::<Vec<_>>()
                .join("; ")
        ));
        let (_, alone) = runs.swap_remove(runs.len() / 2);
        let ap = &alone.probes[0];
        assert_eq!(ap.backend.to_string(), backend, "without perf");
        let aw = ap.workload.as_ref().expect("workload row without perf");
        let (alone_self_less_floor, alone_cpu, _) = own_share(&alone);
        let alone_net = aw
            .net_self_share_of_workload_cpu
            .expect("net share without perf");
        let calls = aw.count.max(1) as f64;
        let ns_per_call = |share: f64| share * alone_cpu as f64 / calls;
        per_call.push((backend, own_ns_per_call(&alone)));
        // The floor's spread: how far one call's instrumentation may be from the p50 taken
        // out, as a share (0 where the clock counts instructions: the floor's calls then all
        // take the same).
        let floor = alone
            .meta
            .floor(ap.backend)
            .expect("the floor of the backend");
        let spread = (floor.p90_ns - floor.p50_ns) as f64 * aw.count as f64 / alone_cpu as f64;
        // The calls that left the CPU (hackbench's tasks are preempted inside the function on
        // a preemptible kernel): memcg-trace takes out their time off the CPU from the
        // scheduler's clock, which starts at the clock update of the `__schedule` that switches
        // the task out and stops at that of the `__schedule` (run by the task before it) that
        // switches it back in: the two tails of `__schedule` after the updates, which perf
        // sees on those tasks' stacks, differ by at most one context switch's cost each.
        let switched = ap.contexts[0].switched as f64;
        let handoff = switched * switch_ns / alone_cpu as f64;
        // perf's side, once per sampling rate, each beside a recording of memcg-trace.
        let rates: Vec<PerfRun> = PROFILE_FREQS
            .iter()
            .map(|&freq| perf_run(&r.out_dir, backend, freq))
            .collect();
        // Under the instruction-counted clock perf's share of the function moves with its
        // sampling rate by more than its sampling error (6.12, fentry, one boot: 1.42% at
        // 4,000 Hz, 1.86% at 7,919, 2.04% at 10,007, 1.82% at 10,000; kprobe 1.00-1.35%;
        // memcg-trace 1.49% and 1.24%): the timer's ticks and its handler's cost (it unwinds
        // through the trampoline or the kprobe machinery) fall in step with the deterministic
        // workload, and no single rate can say which is right (a second timer at 3,989 Hz
        // beside 10,007 in one perf session, which breaks the lock-step, read 1.56-1.57% in two
        // runs where 10,000 Hz alone read 1.92-1.97%). memcg-trace's share must lie
        // within the range perf's rates span, each widened by its own sampling error (4
        // sigma), plus the floor's spread and the switches' handoff.
        let lo = rates
            .iter()
            .map(|p| p.function - p.four_sigma)
            .fold(f64::INFINITY, f64::min);
        let hi = rates
            .iter()
            .map(|p| p.function + p.four_sigma)
            .fold(f64::NEG_INFINITY, f64::max);
        let slack = spread + handoff;
        let shown: Vec<String> = rates
            .iter()
            .map(|p| {
                format!(
                    "{} (about {:.1} ns a call, by the calls and CPU of the run without perf)",
                    p.describe(),
                    ns_per_call(p.function)
                )
            })
            .collect();
        assert!(
            alone_self_less_floor >= lo - slack && alone_self_less_floor <= hi + slack,
            "{backend}: memcg-trace's self share less the instrumentation {alone_self_less_floor:.4} is not within perf's shares of {} at its sampling rates [{lo:.4}, {hi:.4}] (each 4 sigma, the batches' excess over the binomial included) widened by the floor's spread {spread:.4} and {switched} switches of at most {switch_ns} ns {handoff:.4}:\n{}",
            ap.target,
            shown.join("\n"),
        );
        // Beside perf, the timed window holds the function, the floor, and perf's
        // interrupts that land in it: at least perf's share of the function plus the floor's
        // (a tracer that shortened its windows would be below); and at most all perf saw of
        // the function and of the instrumentation (one that counted time twice, above). The
        // function's share is perf's lowest and highest over the rates, as above.
        let lowest = rates
            .iter()
            .map(|p| p.function)
            .fold(f64::INFINITY, f64::min);
        let highest = rates.iter().map(|p| p.function).fold(0.0, f64::max);
        for p in &rates {
            assert!(
                p.total + p.four_sigma >= lowest + p.floor_share,
                "{backend} at {} Hz: memcg-trace's total {:.4} is below perf's lowest share of {} {lowest:.4} + the floor's {:.4} - 4 sigma {:.4}",
                p.freq,
                p.total,
                ap.target,
                p.floor_share,
                p.four_sigma,
            );
            assert!(
                p.total <= highest + p.instrumentation + p.four_sigma_with_instrumentation,
                "{backend} at {} Hz: memcg-trace's total {:.4} is above perf's highest share of the function {highest:.4} + its instrumentation {:.4} + 4 sigma {:.4}",
                p.freq,
                p.total,
                p.instrumentation,
                p.four_sigma_with_instrumentation,
            );
        }
        report.push_str(&format!(
            "{backend} {}: share of the workload's CPU: memcg-trace self less the instrumentation {:.2}% ({:.1} ns a call; runs {}; {} calls left the CPU; net of the tracer's cost {:.2}%; workload CPU {:.3}s); perf {}; ",
            ap.target,
            alone_self_less_floor * 100.0,
            ns_per_call(alone_self_less_floor),
            round_figures.join(", "),
            switched,
            alone_net * 100.0,
            alone_cpu as f64 / 1e9,
            shown.join(", "),
        ));
    }
    // The same function traced two ways: its own instructions per call do not depend on how
    // it is traced, while the instrumentation taken out differs 2-3x between the backends
    // (the floors on 6.12: 232 instructions a call inside the window for fentry, 588 for
    // kprobe). A floor measured wrong, time lost or made up by one backend's pairing, shows
    // here at the resolution of a few instructions a call, where perf's sampling (above)
    // resolves tens. Seen on 6.12: fentry 65.9-67.3 ns, kprobe 65.0-66.0 ns over six runs
    // each, fentry above kprobe by up to 1.6 ns in five of six boots (what the instrumentation
    // in place leaves beyond the floor; the workload's paths through the function also vary a
    // little with the tracer's timing).
    if let [(a, a_ns), (b, b_ns)] = per_call[..] {
        let mean = (a_ns + b_ns) / 2.0;
        assert!(
            (a_ns - b_ns).abs() <= PROFILE_BACKENDS_AGREE * mean,
            "the function's own time per call traced by {a} {a_ns:.1} ns and by {b} {b_ns:.1} ns differ by more than {:.0}%; the runs: {}",
            PROFILE_BACKENDS_AGREE * 100.0,
            details.join(" | ")
        );
        report.push_str(&format!(
            "own time per call: {a} {a_ns:.1} ns, {b} {b_ns:.1} ns (at most {:.0}% apart)",
            PROFILE_BACKENDS_AGREE * 100.0
        ));
    }
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        format!("{name}: {report}\n").as_bytes(),
    );
}

/// The context split's NMI field, seen rather than inferred: QEMU injects an NMI (into the
/// first vCPU) every 10 ms while the selftest runs (TCG has no PMU to raise one, so in every
/// other VM the calibration sees none and places the NMI field above the hardirq field it
/// found). The calibration stops as soon as it has seen softirqs and timer interrupts (20-60
/// ms; it does not wait for NMIs, which only a PMU raises): at 100 ms it missed them on 6.12.
/// The calibration must observe it, and every run of the NMI handlers' tracepoint must be
/// classified NMI; on 7.3, whose hardirq count starts at bit 24, the field sits elsewhere
/// than on 6.12.
fn nmi_on(name: &str, short: &str) {
    let Some(kernel) = one_kernel(name, short) else {
        return;
    };
    let r = boot_with_nmis(
        &kernel,
        format!("{short}-nmi"),
        "memcg-trace selftest >/out/selftest.txt 2>&1 || { cat /out/selftest.txt; exit 1; }\n"
            .into(),
        Vec::new(),
        Vec::new(),
        2,
        None,
        Some(Duration::from_millis(10)),
    );
    let selftest = fs::read_to_string(r.out_dir.join("selftest.txt")).expect("selftest output");
    check_selftest(&selftest);
    let masks = selftest
        .lines()
        .find(|l| l.starts_with("selftest: masks "))
        .unwrap_or_else(|| panic!("{short}: no masks line\n{selftest}"));
    assert!(
        masks.contains("(calibrated; nmi observed)"),
        "{short}: the NMI field was not observed: {masks}\n--- console ---\n{}",
        r.tail(20)
    );
    let row = selftest
        .lines()
        .find(|l| l.starts_with("selftest: nmi_handler (nmi, calibration source): "))
        .unwrap_or_else(|| panic!("{short}: no NMI row\n{selftest}"));
    let number = |word: &str| -> u64 {
        row.split(", ")
            .find_map(|part| {
                let part = part.rsplit(": ").next()?;
                part.strip_suffix(word)?.trim().parse().ok()
            })
            .unwrap_or_else(|| panic!("{short}: no \"{word}\" in {row}"))
    };
    let (hits, nmi) = (number(" hits"), number(" classified nmi"));
    assert!(
        hits > 0 && nmi == hits && row.ends_with(" ok"),
        "{short}: NMI handler runs {hits}, classified NMI {nmi}: {row}"
    );
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        format!("{name}: {masks}; {row}\n").as_bytes(),
    );
}

#[test]
fn vm_nmi_6_12() {
    nmi_on("vm_nmi_6_12", "6.12");
}

#[test]
fn vm_nmi_7_3() {
    nmi_on("vm_nmi_7_3", "7.3");
}

/// The profiler comparison's workload and perf's sampling rates (per CPU): about 3,000 and
/// 8,000 samples of the workload per backend and rate.
const PROFILE_HACKBENCH: &str = "-g 2 -l 100";
const PROFILE_FREQS: [u32; 2] = [4_000, 10_000];
/// Recordings without perf per backend where two are compared: the median of three is the
/// figure compared, so that one run's paths through the function do not decide (three runs in
/// one boot spread by up to 0.3 ns by fentry and 1.6 ns by kprobe). (69.0 ns by fentry against
/// 64.9 by kprobe, in one failed run, was not that: the floor was measured on code other than
/// the traced slot's, see `slot_programs_are_one_code`.)
const PROFILE_ALONE_ROUNDS: u32 = 3;

/// The function's own share of the workload's CPU in a recording of the profiler comparison
/// (its workload row's self time less the instrumentation inside it, the floor per call: what
/// perf's share of the function measures), the workload's CPU time, ns, and its calls.
fn own_share(rec: &memcg_trace::export::Document) -> (f64, u64, u64) {
    let w = rec.probes[0]
        .workload
        .as_ref()
        .expect("workload row without perf");
    let share = w
        .self_share_of_workload_cpu
        .expect("self share without perf")
        - w.floor_share_of_workload_cpu
            .expect("instrumentation share without perf");
    let cpu = rec
        .meta
        .workload
        .as_ref()
        .and_then(|w| w.cpu_ns)
        .expect("the workload's CPU time without perf");
    (share, cpu, w.count)
}

/// The function's own time per call in a recording of the profiler comparison (see
/// [`own_share`]).
fn own_ns_per_call(rec: &memcg_trace::export::Document) -> f64 {
    let (share, cpu, calls) = own_share(rec);
    share * cpu as f64 / calls.max(1) as f64
}

/// How far apart the function's own time per call may be between two backends, as a share
/// of their mean (2.4% seen at most).
const PROFILE_BACKENDS_AGREE: f64 = 0.05;

/// One perf run beside a recording (`profile-BACKEND-FREQ.json`, `perf-shares-BACKEND-FREQ.txt`):
/// perf's shares of the workload's CPU and memcg-trace's beside it.
struct PerfRun {
    freq: u32,
    samples: u64,
    /// Stretches of any CPU perf did not watch (throttled).
    throttled: u64,
    effective: f64,
    /// The batches' spread over the binomial's (at least 1).
    inflation: f64,
    /// perf's share of the function (self, before any instrumentation) and of the
    /// instrumentation.
    function: f64,
    instrumentation: f64,
    /// Four standard errors of the function's share, and of function and instrumentation
    /// together.
    four_sigma: f64,
    four_sigma_with_instrumentation: f64,
    /// memcg-trace's total share beside perf, and its floor-based instrumentation share.
    total: f64,
    floor_share: f64,
}

impl PerfRun {
    fn describe(&self) -> String {
        format!(
            "{} Hz {:.2}% +- {:.2} ({} samples, {} stretches throttled, {:.0} effective, batches {:.2}x the binomial; the instrumentation {:.2}%; memcg-trace beside it: total {:.2}%, floor-based instrumentation {:.2}%)",
            self.freq,
            self.function * 100.0,
            self.four_sigma * 100.0,
            self.samples,
            self.throttled,
            self.effective,
            self.inflation,
            self.instrumentation * 100.0,
            self.total * 100.0,
            self.floor_share * 100.0,
        )
    }
}

/// Reads one perf run of the profiler comparison and checks the recording beside it.
fn perf_run(out: &Path, backend: &str, freq: u32) -> PerfRun {
    let run = format!("{backend}-{freq}");
    let doc = load_recording(&out.join(format!("profile-{run}.json")));
    let text = fs::read_to_string(out.join(format!("profile-{run}.txt"))).unwrap_or_default();
    check_invariants(&doc, &text);
    let w = doc.meta.workload.as_ref().expect("workload");
    let cpu = w.cpu_ns.expect("the workload's CPU time");
    assert!(
        w.cpu_source
            .as_deref()
            .is_some_and(|s| s.contains("cpu.stat")),
        "{run}: {:?}",
        w.cpu_source
    );
    let p = &doc.probes[0];
    assert_eq!(p.backend.to_string(), backend);
    let wo = p.workload.as_ref().expect("workload row");
    let (total, own, net, instr) = (
        wo.share_of_workload_cpu.expect("total share"),
        wo.self_share_of_workload_cpu.expect("self share"),
        wo.net_self_share_of_workload_cpu.expect("net share"),
        wo.floor_share_of_workload_cpu
            .expect("instrumentation share"),
    );
    // Traced alone, the charge step nests in nothing and holds no traced call.
    assert!(
        // net = (self - instrumentation inside it) / (CPU - the tracer's full cost): at
        // least self - instrumentation (the untraced CPU is at most the CPU), and above
        // self where the tracer's cost is a large part of the CPU.
        (own - total).abs() < 1e-9
            && net > 0.0
            && net + 1e-9 >= own - instr
            && instr > 0.0
            && total < 1.0,
        "{run}: total {total}, self {own}, net {net}, instrumentation {instr}"
    );
    assert!(
        text.contains("workload CPU: "),
        "{run}: the table lacks the workload's CPU\n{text}"
    );
    let shares =
        fs::read_to_string(out.join(format!("perf-shares-{run}.txt"))).expect("perf's counts");
    let perf = PerfShares::parse(&shares, &p.target)
        .unwrap_or_else(|| panic!("{run}: perf's counts unreadable:\n{shares}"));
    let n = perf.samples as f64;
    assert!(n >= 2000.0, "{run}: perf took {n} samples\n{shares}");
    assert!(
        (perf.ns as f64 - cpu as f64).abs() <= 0.05 * cpu as f64,
        "{run}: perf's time of the workload {} ns is not its cgroup's CPU usage {cpu} ns ({} stretches, {} ns in all, of any task, not watched)\n{shares}",
        perf.ns,
        perf.throttled,
        perf.throttled_ns,
    );
    assert!(
        perf.function_self > 0,
        "{run}: perf saw no sample in {}\n{shares}",
        p.target
    );
    let share = |ns: u64| ns as f64 / perf.ns as f64;
    let (function, instrumentation) =
        (share(perf.function_self_ns), share(perf.instrumentation_ns));
    // The standard error of a share of perf's weighted samples: binomial over the effective
    // number of samples, (sum of weights)^2 / sum of squared weights (the number of samples
    // where all weigh the same, fewer where some weigh more), widened where batches of
    // consecutive samples vary more than independent samples would (the sampler's ticks
    // falling in step with the workload). Four of them: a run makes about ten comparisons,
    // so that noise fails one less than once in a thousand.
    let effective = (perf.ns as f64).powi(2) / perf.ns2;
    let binomial = |q: f64| (q * (1.0 - q) / effective).sqrt();
    let inflation = perf
        .batch_se()
        .map(|b| (b / binomial(function)).max(1.0))
        .unwrap_or(1.0);
    PerfRun {
        freq,
        samples: perf.samples,
        throttled: perf.throttled,
        effective,
        inflation,
        function,
        instrumentation,
        four_sigma: 4.0 * inflation * binomial(function),
        four_sigma_with_instrumentation: 4.0 * inflation * binomial(function + instrumentation),
        total,
        floor_share: instr,
    }
}

/// What the profile guest script counted of the workload's samples (`perf-shares-*.txt`):
/// numbers of samples and their weights (ns since the previous sample on the CPU, or since
/// its sampling resumed after a throttle).
#[derive(Debug)]
struct PerfShares {
    samples: u64,
    ns: u64,
    /// Sum of the squared weights, ns^2.
    ns2: f64,
    instrumentation_ns: u64,
    /// Stretches of the run perf did not watch (a CPU's sampling throttled until a later
    /// tick), and their ns: the sample after one weighs only the time since sampling resumed.
    throttled: u64,
    throttled_ns: u64,
    function_self: u64,
    function_self_ns: u64,
    /// Per batch of consecutive samples: (all ns, the function's self ns).
    batches: Vec<(f64, f64)>,
}

impl PerfShares {
    fn parse(text: &str, function: &str) -> Option<PerfShares> {
        let row = |k: &str| -> Option<Vec<u64>> {
            let v: Vec<u64> = text
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{k} ")))?
                .split_whitespace()
                .map(|x| x.parse().ok())
                .collect::<Option<_>>()?;
            Some(v)
        };
        let (all, ins, throttled, f) = (
            row("samples")?,
            row("instrumentation")?,
            row("throttled")?,
            row(function)?,
        );
        Some(PerfShares {
            samples: *all.first()?,
            ns: *all.get(1)?,
            ns2: *all.get(2)? as f64,
            instrumentation_ns: *ins.get(1)?,
            throttled: *throttled.first()?,
            throttled_ns: *throttled.get(1)?,
            function_self: *f.first()?,
            function_self_ns: *f.get(2)?,
            // "batch INDEX NS FUNCTION SELF_NS ...".
            batches: text
                .lines()
                .filter_map(|l| {
                    let w: Vec<&str> = l.strip_prefix("batch ")?.split_whitespace().collect();
                    let all: f64 = w.get(1)?.parse().ok()?;
                    let at = w.iter().position(|x| *x == function)?;
                    Some((all, w.get(at + 1)?.parse().ok()?))
                })
                .collect(),
        })
    }

    /// The standard error of the function's share from the spread of its batches (the ratio
    /// estimator's); None with fewer than 5 batches.
    fn batch_se(&self) -> Option<f64> {
        let k = self.batches.len();
        if k < 5 {
            return None;
        }
        let all: f64 = self.batches.iter().map(|b| b.0).sum();
        let share = self.batches.iter().map(|b| b.1).sum::<f64>() / all;
        let mean = all / k as f64;
        let ss: f64 = self
            .batches
            .iter()
            .map(|(a, f)| (f - share * a).powi(2))
            .sum();
        Some((ss / (k as f64 * (k - 1) as f64)).sqrt() / mean)
    }
}

#[test]
fn vm_profile_6_12() {
    profile_on("vm_profile_6_12", "6.12");
}

#[test]
fn vm_profile_7_3() {
    profile_on("vm_profile_7_3", "7.3");
}
