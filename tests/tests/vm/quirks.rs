//! What sets each kernel of the VM tests apart: facts of Debian's build that the checks
//! depend on, and the matrix's scenarios run on it (`matrix::scenarios`).

/// What sets a kernel of the matrix apart: facts of Debian's build that the checks depend on,
/// and the scenarios run on it besides the common recordings (each where it shows what it
/// tests; each scenario's comment in `matrix` says why).
#[derive(Clone, Copy, Default)]
pub(crate) struct Quirks {
    /// Before 5.19: the legacy object; no per-CPU section in its BTF (the no-split run).
    pub(crate) legacy: bool,
    /// Before 5.16: the kernel counts no verified instructions (`check_verified`).
    pub(crate) no_verified_insns: bool,
    /// The build preempts (6.18, 7.3 and arm64 7.3, the RT builds): `auto` takes kprobe there,
    /// fentry elsewhere.
    pub(crate) preemptible: bool,
    /// A PREEMPT_RT build: softirqs counted in the task (the loopback TCP scenario).
    pub(crate) rt: bool,
    /// `charge` resolves to the slab hook, which is `slab_post_alloc` too (7.x).
    pub(crate) charge_is_slab_hook: bool,
    /// Scenarios: the workload beside another charger, and moved below its own cgroup.
    pub(crate) moved: bool,
    /// Scenario: every probe (`--all`), no function traced twice.
    pub(crate) all: bool,
    /// Scenario: the dynamic preemption model changed while the programs run.
    pub(crate) repreempt: bool,
    /// Scenario: charges inside a BPF map update system call (kprobe runs skipped).
    pub(crate) skips: bool,
    /// The kernel counts a kprobe program's skipped runs as its misses (6.7+).
    pub(crate) kprobe_misses_counted: bool,
    /// Scenario: the switch witness proving a kprobe's deferred pairs (before 6.7, preemptible).
    pub(crate) witness: bool,
    /// Scenario: kallsyms' addresses hidden on arm64 (no per-CPU offset).
    pub(crate) hidden_percpu: bool,
}

/// The quirks of kernel `short` (see [`Quirks`]).
pub(crate) fn quirks(short: &str) -> Quirks {
    let none = Quirks::default();
    match short {
        "5.10" => Quirks {
            legacy: true,
            no_verified_insns: true,
            moved: true,
            ..none
        },
        "6.1" => Quirks {
            skips: true,
            ..none
        },
        "6.12" => Quirks {
            kprobe_misses_counted: true,
            moved: true,
            all: true,
            skips: true,
            ..none
        },
        "6.18" => Quirks {
            kprobe_misses_counted: true,
            preemptible: true,
            ..none
        },
        "7.3" => Quirks {
            kprobe_misses_counted: true,
            preemptible: true,
            charge_is_slab_hook: true,
            moved: true,
            all: true,
            repreempt: true,
            ..none
        },
        "6.1-rt" => Quirks {
            preemptible: true,
            rt: true,
            witness: true,
            ..none
        },
        "6.12-rt" => Quirks {
            kprobe_misses_counted: true,
            preemptible: true,
            rt: true,
            ..none
        },
        "arm64-6.12" => Quirks {
            kprobe_misses_counted: true,
            hidden_percpu: true,
            ..none
        },
        "arm64-7.3" => Quirks {
            kprobe_misses_counted: true,
            preemptible: true,
            charge_is_slab_hook: true,
            ..none
        },
        other => panic!("kernel {other}: no quirks listed for it in the matrix"),
    }
}
