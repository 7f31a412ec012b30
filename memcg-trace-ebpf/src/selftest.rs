//! The self-test program: the pairing logic run against scripted calls (`Given`) through
//! BPF_PROG_TEST_RUN.

use crate::*;

/// Inputs given by the self-test instead of read from the kernel.
pub(crate) struct Given {
    pub(crate) cpu: u32,
    pub(crate) now: u64,
    pub(crate) ctx: u32,
    pub(crate) task: u64,
    pub(crate) switches: u64,
    pub(crate) clock: u64,
    pub(crate) migrations: u64,
    pub(crate) workload: bool,
    pub(crate) misses: Option<u64>,
    pub(crate) cross_cpu_clock: bool,
    /// Runs interleave on the CPU (as fentry on a preemptible kernel).
    pub(crate) atomic: bool,
    pub(crate) st: St,
}

impl Env for Given {
    fn now(&self) -> u64 {
        self.now
    }
    fn cpu(&self) -> u32 {
        self.cpu
    }
    fn context(&self) -> Option<u32> {
        (self.ctx < NUM_CTX as u32).then_some(self.ctx)
    }
    fn task(&self) -> u64 {
        self.task
    }
    fn switches(&self, _task: u64) -> u64 {
        self.switches
    }
    fn clock(&self, _task: u64) -> u64 {
        self.clock
    }
    fn migrations(&self, _task: u64) -> u64 {
        self.migrations
    }
    fn cross_cpu_clock(&self) -> bool {
        self.cross_cpu_clock
    }
    fn in_workload(&self, _task: u64) -> bool {
        self.workload
    }
    fn atomic(&self) -> bool {
        self.atomic
    }
    fn entry_misses(&self, _probe: u32) -> Option<u64> {
        self.misses
    }
    fn state(&self) -> St {
        self.st
    }
    fn nest(&self) -> Option<&'static mut Nest> {
        if self.atomic {
            return None;
        }
        // SAFETY: the test CPU's state, valid for the run.
        Some(unsafe { &mut (*self.st.0).nest })
    }
    fn testing(&self) -> bool {
        true
    }
    fn thread_kind(&self, task: u64) -> u32 {
        // The self-test marks a task's kind in the top byte of its id.
        ((task >> 56) & 3) as u32
    }
}

// The test-run entries answer by their return value, which BPF_PROG_TEST_RUN hands back.
// aya's `#[raw_tracepoint]` makes every program return 0, whatever the function returns: they
// are declared by hand instead, as raw tracepoint programs (section `raw_tp`) that return it.

/// Test entry for BPF_PROG_TEST_RUN (`memcg_trace_common::test_op`): runs the real pairing and
/// bucketing code on inputs passed in the raw-tracepoint arguments, or reports the context the
/// program runs in (the caller runs in task context). Returns 0, the context, or -1 for inputs
/// it refuses.
#[no_mangle]
#[link_section = "raw_tp"]
pub fn selftest(ctx: *mut c_void) -> u32 {
    run_selftest(RawTracePointContext::new(ctx)) as u32
}

#[inline(always)]
fn run_selftest(ctx: RawTracePointContext) -> i32 {
    // SAFETY: the test-run context is an array of 12 u64 arguments supplied by userspace.
    let a = |i: usize| unsafe { *(ctx.as_ptr() as *const u64).add(i) };
    let Some(st) = cpu_state(&ctx) else {
        return -1;
    };
    // Through a register the compiler cannot see into: it then indexes with the very value the
    // verifier saw checked (from the argument itself it derived an index, `arg & 15`, that the
    // verifier cannot bound).
    let probe = opaque_u64(a(1));
    if probe >= MAX_PROBES as u64 {
        return -1;
    }
    let probe = probe as u32;
    let given = Given {
        cpu: st.cpu(),
        now: a(6),
        ctx: a(3) as u32,
        task: a(4),
        switches: a(5),
        clock: a(11),
        migrations: a(7) >> 8,
        workload: a(7) & 1 != 0,
        misses: (a(9) != 0).then(|| a(8)),
        cross_cpu_clock: a(10) == 0,
        atomic: a(7) & 4 != 0,
        st: St(st.0),
    };
    match a(0) {
        // The call site of a test call: its frame with the lowest bit set (frames are aligned).
        // Its memcg: the frame with the two lowest bits set.
        test_op::ENTRY => pair_entry(
            &given,
            probe,
            Key::given(a(2)),
            a(7) & 2 != 0,
            a(2) | 1,
            Charged::id(a(2) | 3),
            |_| {},
        ),
        test_op::EXIT_FENTRY => pair_exit(&given, probe, Key::given(a(2)), true),
        test_op::EXIT_KPROBE => pair_exit(&given, probe, Key::given(a(2)), false),
        test_op::BUCKET => {
            if let Some(c) = cell_of(st.cpu(), probe, CTX_TASK, false, false) {
                record(&mut c.hist, a(2), a(2), 0, 0, 0, false);
            }
        }
        test_op::CONTEXT => return read_context(st, false).map(|c| c as i32).unwrap_or(-1),
        test_op::CLEAR_USED => {
            if let Some(set) = pending(st, probe) {
                atomic_keep_bits(&mut set.used, 0);
            }
        }
        _ => return -1,
    }
    0
}

/// Test-run entry that answers the one question userspace cannot: the depth (`cgroup->level`)
/// of the caller's cgroup v2 in the whole hierarchy, which a cgroup namespace or a mounted
/// subtree hides from paths. Returns that level plus one, 0 where the layout lacks a member or
/// a read fails. Fault-safe reads from `bpf_get_current_task()`, as on every kernel.
#[no_mangle]
#[link_section = "raw_tp"]
pub fn own_cgroup_level(_ctx: *mut c_void) -> u32 {
    cgroup_level_of_current() as u32
}

#[inline(always)]
fn cgroup_level_of_current() -> i32 {
    let l = layout();
    if l.task_cgroups == 0 || l.cset_dfl_cgrp == 0 || l.cgroup_level == 0 {
        return 0;
    }
    // SAFETY: helper without preconditions.
    let task = unsafe { bpf_get_current_task() };
    // SAFETY: reads of kernel memory through bpf_probe_read_kernel.
    let css_set = unsafe { bpf_probe_read_kernel((task + l.task_cgroups) as *const u64) };
    let Some(css_set) = css_set.ok().filter(|&p| p != 0) else {
        return 0;
    };
    // SAFETY: as above.
    let cgrp = unsafe { bpf_probe_read_kernel((css_set + l.cset_dfl_cgrp) as *const u64) };
    let Some(cgrp) = cgrp.ok().filter(|&p| p != 0) else {
        return 0;
    };
    // SAFETY: as above.
    match unsafe { bpf_probe_read_kernel((cgrp + l.cgroup_level) as *const i32) } {
        Ok(level) if level >= 0 => level + 1,
        _ => 0,
    }
}
