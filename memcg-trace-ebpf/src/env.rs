//! What the pairing logic asks of the kernel, behind a trait: the real kernel (`Kernel`), or the
//! self-test's scripted one (`Given`, in `selftest`).

use crate::*;

/// What the pairing reads from the running kernel, or, in the self-test, from given inputs.
pub(crate) trait Env {
    /// `bpf_ktime_get_ns()`.
    fn now(&self) -> u64;
    /// This CPU's number.
    fn cpu(&self) -> u32;
    /// The context the program runs in (None: unreadable).
    fn context(&self) -> Option<u32>;
    /// The current task (read once per run, passed to the two below).
    fn task(&self) -> u64;
    /// The current task's switch count (`read_switches`).
    fn switches(&self, task: u64) -> u64;
    /// The current task's off-CPU clock (`read_off_clock`).
    fn clock(&self, task: u64) -> u64;
    /// The current task's `se.nr_migrations` (see `Pending::migrations`).
    fn migrations(&self, task: u64) -> u64;
    /// Whether the current task belongs to the workload's cgroup.
    fn in_workload(&self, task: u64) -> bool;
    /// Whether counter and histogram updates must be atomic: programs that can be preempted
    /// (fentry on preemptible kernels) may interleave with another run on the same CPU.
    fn atomic(&self) -> bool;
    /// Whether fentry/fexit programs run preemptible on this kernel (`Config::preemptible`),
    /// which decides where their calls that leave the CPU are deferred to userspace.
    fn fentry_preemptible(&self) -> bool {
        config().preemptible != 0
    }
    /// The runs of `probe`'s entry program missed on this CPU, when known (see
    /// `PROG_MISSES`): its recursion misses here, or the switch witness's count here.
    fn entry_misses(&self, probe: u32) -> Option<u64>;
    /// Whether the task clocks of different CPUs are comparable (a migrated call's time off
    /// the CPU is known).
    fn cross_cpu_clock(&self) -> bool;
    /// This CPU's nesting stack (self time); None where runs can interleave on one CPU
    /// (fentry on preemptible kernels), which would tear it.
    fn nest(&self) -> Option<&'static mut Nest>;
    /// This CPU's state.
    fn state(&self) -> St;
    /// The self-test, whose sequences run with no program attached.
    fn testing(&self) -> bool {
        false
    }
    /// What kind of thread `task` (from `task()`) is: [`THREAD_IRQ`], [`THREAD_SOFTIRQ`] or
    /// [`THREAD_OTHER`]; always the last where threads do no interrupt work.
    fn thread_kind(&self, _task: u64) -> u32 {
        THREAD_OTHER
    }
    /// A program built for the plain settings (`names::FENTRY_LEAN`), which the loader chose
    /// it for: no call sites, stacks or charged memcgs (userspace's `fentry_build`). Its tests
    /// of those settings are constants, so the compiler drops the code they guard and the
    /// loads of the settings.
    fn plain(&self) -> bool {
        false
    }
}

/// The running kernel.
pub(crate) struct Kernel {
    pub(crate) st: St,
    /// Whether the program can run preemptible: fentry/fexit on preemptible kernels. False for
    /// kprobes and tracepoints, and for the patched fentry/fexit programs, which the loader
    /// takes only where fentry runs do not interleave (`fentry_build`): their tests of it are
    /// then constants, so the compiler drops the atomic updates and the loads of the setting.
    pub(crate) preemptible: bool,
    /// A patched program (`names::FENTRY_PATCHED`, and the lean ones): the task's fields and
    /// its cgroup by plain loads at offsets the loader writes into the loads (`lean_load`),
    /// which it takes only where the layout allows them.
    pub(crate) patched: bool,
    /// Built for the plain settings (see `Env::plain`).
    pub(crate) plain: bool,
}

impl Env for Kernel {
    #[inline(always)]
    fn now(&self) -> u64 {
        // SAFETY: helper without preconditions.
        unsafe { bpf_ktime_get_ns() }
    }
    #[inline(always)]
    fn cpu(&self) -> u32 {
        self.st.cpu()
    }
    #[inline(always)]
    fn context(&self) -> Option<u32> {
        read_context(self.st, self.patched)
    }
    #[inline(always)]
    fn task(&self) -> u64 {
        current_task(self.st, self.patched)
    }
    #[inline(always)]
    fn switches(&self, task: u64) -> u64 {
        read_switches(task, self.patched)
    }
    #[inline(always)]
    fn clock(&self, task: u64) -> u64 {
        read_off_clock(task, self.patched)
    }
    #[inline(always)]
    fn migrations(&self, task: u64) -> u64 {
        if self.patched {
            return lean_load::<{ LeanField::Migrations.marker() }>(task);
        }
        read_task_u64(layout(), task, layout().task_migrations, false)
    }
    #[inline(always)]
    fn thread_kind(&self, task: u64) -> u32 {
        let l = layout();
        // On a read-only field: the verifier drops the load where it is 0.
        if l.task_comm == 0 {
            return THREAD_OTHER;
        }
        thread_kind_of(read_task_u32(l, task, l.task_comm, self.patched))
    }
    #[inline(always)]
    fn cross_cpu_clock(&self) -> bool {
        layout().cross_cpu_clock != 0
    }
    #[inline(always)]
    fn in_workload(&self, task: u64) -> bool {
        let c = config();
        let w = c.workload_cgroup;
        if w == 0 {
            return false;
        }
        let l = layout();
        if self.patched || (l.direct_task != 0 && l.direct_cgroup != 0) {
            let cgrp = if self.patched {
                lean_dfl_cgrp(task)
            } else {
                dfl_cgrp(l, task)
            };
            // SAFETY: `st` is this CPU's state, written only by this CPU's programs and only
            // through its pointer.
            let cache = unsafe { core::ptr::addr_of_mut!((*self.st.0).workload_cgrp) };
            if c.workload_owned != 0 && cgrp as u64 == unsafe { core::ptr::read(cache) } {
                return true;
            }
            if cgrp_id(l, cgrp) != w {
                return under_workload(c);
            }
            if c.workload_owned != 0 {
                // SAFETY: as above.
                unsafe { core::ptr::write(cache, cgrp as u64) };
            }
            return true;
        }
        cgroup_id(task) == w || under_workload(c)
    }
    #[inline(always)]
    fn atomic(&self) -> bool {
        self.preemptible && config().preemptible != 0
    }
    #[inline(always)]
    fn fentry_preemptible(&self) -> bool {
        // Read only by fentry/fexit programs, which have `preemptible` set but for the patched.
        self.atomic()
    }
    #[inline(always)]
    fn state(&self) -> St {
        self.st
    }
    #[inline(always)]
    fn plain(&self) -> bool {
        self.plain
    }
    #[inline(always)]
    fn nest(&self) -> Option<&'static mut Nest> {
        if self.atomic() {
            return None;
        }
        // SAFETY: this CPU's state, valid for the run; only this CPU's programs, which do not
        // interleave here, touch its stack.
        Some(unsafe { &mut (*self.st.0).nest })
    }
    #[inline(always)]
    fn entry_misses(&self, probe: u32) -> Option<u64> {
        // SAFETY: pointer from a successful map lookup.
        let p = unsafe { *PROG_MISSES.get_ptr(probe)? };
        if p == MISSES_BY_WITNESS {
            let h = crate::programs::HELD_SWITCHES.get_ptr(self.cpu())?;
            // SAFETY: pointer from a successful map lookup; this CPU's count, which only its
            // context switches write, and a switch does not run inside a program.
            return Some(unsafe { core::ptr::read_volatile(core::ptr::addr_of!((*h).held)) });
        }
        if p == 0 || self.st.pcpu_offset() == 0 {
            return None;
        }
        // SAFETY: a per-CPU counter of a loaded program, read through the fault-safe helper.
        unsafe { bpf_probe_read_kernel((p + self.st.pcpu_offset()) as *const u64) }.ok()
    }
}
