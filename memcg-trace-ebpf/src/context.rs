//! Where a call runs: this CPU's state, the preempt count and the context it tells, the current
//! task and its cgroup.

use crate::*;

/// This CPU's state, with the address of its preempt count found on first use (see
/// `find_cpu_base`).
#[inline(always)]
pub(crate) fn cpu_state<C: EbpfContext>(c: &C) -> Option<St> {
    // SAFETY: helper without preconditions.
    let cpu = unsafe { bpf_get_smp_processor_id() };
    let ptr = CPU_STATE.get_ptr_mut(cpu)?;
    // SAFETY: pointer from a successful map lookup; only programs on this CPU write it.
    if unsafe { (*ptr).preempt_addr } != 0 || find_cpu_base(c, ptr) {
        return Some(St(ptr));
    }
    None
}

/// This CPU's state: a pointer to its element of `CPU_STATE`. No reference to the whole value is ever
/// made: its header fields are read through the pointer (below), and the parts the programs
/// write (nesting sums, pending sets, tracepoint hits, the workload cache) are reached by
/// field, so that a reference to one part never overlaps one to another.
#[derive(Clone, Copy)]
pub(crate) struct St(pub(crate) *mut CpuState);

impl St {
    /// This CPU's memcg memo of probe slot `probe` (`CpuState::memcg_memo`).
    #[inline(always)]
    pub(crate) fn memcg_memo(self, probe: u32) -> Option<*mut MemcgMemo> {
        let i = probe as usize;
        if i >= MAX_PROBES {
            return None;
        }
        // SAFETY: an element of this CPU's state, in bounds; reached by field (see `St`).
        Some(unsafe { core::ptr::addr_of_mut!((*self.0).memcg_memo[i]) })
    }
    /// This CPU's number.
    #[inline(always)]
    pub(crate) fn cpu(self) -> u32 {
        // SAFETY: a pointer from a successful map lookup, valid for the program's run.
        unsafe { core::ptr::addr_of!((*self.0).cpu).read() }
    }
    /// The address of this CPU's preempt count.
    #[inline(always)]
    pub(crate) fn preempt_addr(self) -> u64 {
        // SAFETY: as above.
        unsafe { core::ptr::addr_of!((*self.0).preempt_addr).read() }
    }
    /// The address of this CPU's pointer to the running task (0: unknown).
    #[inline(always)]
    pub(crate) fn current_addr(self) -> u64 {
        // SAFETY: as above.
        unsafe { core::ptr::addr_of!((*self.0).current_addr).read() }
    }
    /// This CPU's `__per_cpu_offset`.
    #[inline(always)]
    pub(crate) fn pcpu_offset(self) -> u64 {
        // SAFETY: as above.
        unsafe { core::ptr::addr_of!((*self.0).pcpu_offset).read() }
    }
}

/// The kernel per-CPU variable holding the preempt count, as the verifier's
/// `PTR_TO_PERCPU_BTF_ID`: an `ld_imm64` of [`PERCPU_VAR_MARKER`] that the loader rewrites into
/// a `BPF_PSEUDO_BTF_ID` load of `__preempt_count` or `pcpu_hot`. Only reached when
/// `direct_preempt` is set; otherwise the verifier, which knows the read-only layout, never
/// explores it.
#[inline(always)]
pub(crate) fn percpu_var() -> *const c_void {
    let var: u64;
    // SAFETY: loads a constant into a register; the loader gives it its meaning.
    unsafe {
        core::arch::asm!("{0} = {m} ll", out(reg) var, m = const PERCPU_VAR_MARKER,
            options(nomem, nostack, preserves_flags));
    }
    var as *const c_void
}

/// The 4-byte int at kernel address `addr`, by a plain load the verifier makes fault-safe
/// (`BPF_PROBE_MEM`): `addr` cast by `bpf_rdonly_cast` to `atomic_t`'s struct (a `call` of
/// [`RDONLY_CAST_MARKER`] that the loader rewrites into the kfunc, and the verifier into a
/// register move). Only reached when `direct_untrusted` is set; otherwise the verifier, which
/// knows the read-only layout, never explores it. A faulting address reads as 0.
#[inline(always)]
pub(crate) fn untrusted_u32(addr: u64) -> u32 {
    // SAFETY: a fault-safe load through the cast (see `cast`).
    unsafe { *(cast(addr, layout().cast_type_id) as *const u32) }
}

/// The u64 at kernel address `addr`, fault-safe (a fault reads 0), for the memcg chase and
/// the call sites' frames and code: a plain load through the cast where the loader made it
/// (`direct_reads`), else `bpf_probe_read_kernel`, a helper call that costs several times as
/// much. The branch hangs on a read-only field: the verifier keeps one of the two.
#[inline(always)]
pub(crate) fn kernel_u64(addr: u64) -> u64 {
    let l = layout();
    if l.direct_reads != 0 {
        // SAFETY: a fault-safe load through the cast (see `cast`): `atomic64_t`'s 8-byte
        // counter at offset 0.
        return unsafe { *(cast(addr, l.cast_u64_type_id) as *const u64) };
    }
    // SAFETY: a fault-safe read of kernel memory.
    unsafe { bpf_probe_read_kernel(addr as *const u64) }.unwrap_or(0)
}

/// `bpf_rdonly_cast(addr, type_id)`: `addr` as a pointer to the vmlinux struct `type_id`,
/// through which the verifier allows plain loads of that struct's members and makes them
/// fault-safe. Only where `direct_untrusted` (see `untrusted_u32`) or `direct_reads` (see
/// `kernel_u64`) is set: the loader patched the calls.
#[inline(always)]
pub(crate) fn cast(addr: u64, type_id: u32) -> u64 {
    let p: u64;
    // SAFETY: the kfunc call takes r1 (the address) and r2 (the BTF id, a verifier-known
    // constant from the read-only layout), returns in r0 and clobbers r1-r5, as declared.
    unsafe {
        core::arch::asm!("call {m}", m = const RDONLY_CAST_MARKER,
            inout("r1") addr => _, inout("r2") type_id as u64 => _,
            lateout("r0") p, lateout("r3") _, lateout("r4") _, lateout("r5") _,
            options(nostack, readonly));
    }
    p
}

/// This CPU's preempt count: a plain load through `bpf_this_cpu_ptr` where the loader could
/// name the variable, else a plain fault-safe load of the address found in cpu_state where
/// the kernel can cast it (`untrusted_u32`), else a `bpf_probe_read_kernel` of that address.
#[inline(always)]
pub(crate) fn preempt_count(st: St) -> Option<u32> {
    let l = layout();
    if l.arch == ARCH_ARM64 {
        // In the running task's thread_info (`preempt_count`: its offset in task_struct).
        // SAFETY: a helper without preconditions.
        let addr = unsafe { bpf_get_current_task() } + l.preempt_count;
        if l.direct_untrusted != 0 {
            return Some(untrusted_u32(addr));
        }
        // SAFETY: a fault-safe read of kernel memory.
        return unsafe { bpf_probe_read_kernel(addr as *const u32) }.ok();
    }
    if l.direct_preempt != 0 {
        // SAFETY: bpf_this_cpu_ptr of a per-CPU kernel variable never returns NULL, and the
        // verifier checks the load against the variable's BTF type.
        unsafe {
            let p = bpf_this_cpu_ptr(percpu_var()) as *const u8;
            return Some(*(p.add(l.preempt_member as usize) as *const u32));
        }
    }
    if l.direct_untrusted != 0 {
        return Some(untrusted_u32(st.preempt_addr()));
    }
    // SAFETY: address verified in cpu_state.
    unsafe { bpf_probe_read_kernel(st.preempt_addr() as *const u32) }.ok()
}

/// The count the context split reads: the preempt count, except on PREEMPT_RT, where softirqs
/// run in tasks and the kernel counts them in the task (`softirq_disable_cnt`): the softirq
/// byte then comes from there (`rt_context_count`). The branch hangs on a read-only field, so
/// on every other kernel the verifier drops it.
#[inline(always)]
pub(crate) fn context_count(st: St, patched: bool) -> Option<u32> {
    let pc = preempt_count(st)?;
    let l = layout();
    if l.task_softirq == 0 {
        return Some(pc);
    }
    let task = current_task(st, patched);
    Some(rt_context_count(
        pc,
        read_task_u32(l, task, l.task_softirq, patched),
    ))
}

/// The kernel's `in_task()` split for the running code: task, softirq, hardirq or NMI.
#[inline(always)]
pub(crate) fn read_context(st: St, patched: bool) -> Option<u32> {
    let l = layout();
    let pc = context_count(st, patched)?;
    // Task context, the usual case, by one test (the loader checks the union is the masks').
    if pc & l.interrupt_masks as u32 == 0 {
        return Some(CTX_TASK);
    }
    Some(classify(pc, l.nmi_mask, l.hardirq_mask, l.softirq_offset))
}

/// The current task, as a number that identifies it. Direct: `bpf_get_current_task_btf`, a
/// pointer the verifier knows the type of, so its fields are plain loads (`read_switches`,
/// `cgroup_id`); it must reach them unchanged. Where the kernel can cast (`direct_untrusted`)
/// and BTF names the per-CPU pointer to the running task, the same pointer without a helper
/// call: loaded from this CPU's copy and cast to `task_struct`. `patched`: a patched program
/// (`Kernel::patched`), which the loader takes only where the layout reads the task directly.
#[inline(always)]
pub(crate) fn current_task(st: St, patched: bool) -> u64 {
    let l = layout();
    // Gated on read-only fields only, so that the verifier drops the branch not taken (a
    // cast to type id 0 does not load before 6.15).
    if (patched || l.direct_task != 0) && l.direct_untrusted != 0 && l.current_task != 0 {
        // SAFETY: a fault-safe load through the cast (see `cast`).
        let task = unsafe { *(cast(st.current_addr(), l.cast_u64_type_id) as *const u64) };
        return cast(task, l.cast_task_type_id);
    }
    // SAFETY: helpers without preconditions.
    unsafe {
        if patched || layout().direct_task != 0 {
            bpf_get_current_task_btf() as u64
        } else {
            bpf_get_current_task()
        }
    }
}

/// `task->cgroups->dfl_cgrp` by plain loads: only where the layout allows (`direct_task` and
/// `direct_cgroup`), with `task` from `current_task`.
#[inline(always)]
pub(crate) fn dfl_cgrp(l: &KernelLayout, task: u64) -> *const u8 {
    // SAFETY: each pointer is the verifier's BTF pointer of the member's type, and each load is
    // checked against that type (a fault reads 0 instead of crashing).
    unsafe {
        let cset = *((task as *const u8).add(l.task_cgroups as usize) as *const *const u8);
        *(cset.add(l.cset_dfl_cgrp as usize) as *const *const u8)
    }
}

/// [`dfl_cgrp`] for the patched programs, at offsets the loader writes into the loads
/// ([`lean_load`]).
#[inline(always)]
pub(crate) fn lean_dfl_cgrp(task: u64) -> *const u8 {
    let cset = lean_load::<{ LeanField::Cgroups.marker() }>(task);
    lean_load::<{ LeanField::DflCgrp.marker() }>(cset) as *const u8
}

/// `cgrp->kn->id` by plain loads, `cgrp` from [`dfl_cgrp`].
#[inline(always)]
pub(crate) fn cgrp_id(l: &KernelLayout, cgrp: *const u8) -> u64 {
    // SAFETY: as in dfl_cgrp.
    unsafe {
        let kn = *(cgrp.add(l.cgroup_kn as usize) as *const *const u8);
        *(kn.add(l.kn_id as usize) as *const u64)
    }
}

/// The cgroup v2 id of `task` (from `current_task`): `task->cgroups->dfl_cgrp->kn->id` by
/// plain loads where the layout allows (what `bpf_get_current_cgroup_id` reads, minus the
/// call), else the helper.
#[inline(always)]
pub(crate) fn cgroup_id(task: u64) -> u64 {
    let l = layout();
    if l.direct_task != 0 && l.direct_cgroup != 0 {
        return cgrp_id(l, dfl_cgrp(l, task));
    }
    // SAFETY: helper without preconditions.
    unsafe { bpf_get_current_cgroup_id() }
}

/// Whether the current task's cgroup lies below the workload's (a cgroup the workload made and
/// moved into): its ancestor at the workload's depth is the workload's cgroup. One helper
/// call, made only for tasks outside the workload's own cgroup. The legacy object's kernels
/// (before 5.18) refuse that helper to tracing programs: there the same answer is read from
/// the cgroup (see [`under_workload_by_reads`]).
#[inline(always)]
pub(crate) fn under_workload(c: &Config) -> bool {
    if c.workload_level == 0 {
        return false;
    }
    if LEGACY {
        return under_workload_by_reads(c, layout());
    }
    // SAFETY: helper without preconditions.
    unsafe { bpf_get_current_ancestor_cgroup_id(c.workload_level as i32) == c.workload_cgroup }
}

/// [`under_workload`] by fault-safe reads: `task->cgroups->dfl_cgrp`, then, if that cgroup
/// lies deeper than the workload's, its ancestor at the workload's depth, an id in
/// `cgroup.ancestor_ids[]` (before 6.0) or a pointer in `cgroup.ancestors[]` whose id is read
/// like [`cgrp_id`]. False when the layout lacks a member or a read fails. The task is the
/// helper's plain address, whatever `current_task` gives the caller (a verifier's pointer there
/// on the kernels the patched programs run on).
#[inline(always)]
fn under_workload_by_reads(c: &Config, l: &KernelLayout) -> bool {
    if l.task_cgroups == 0 || l.cgroup_level == 0 || l.cgroup_ancestors == 0 {
        return false;
    }
    // SAFETY: helper without preconditions.
    let task = unsafe { bpf_get_current_task() };
    let read = |addr: u64| -> u64 {
        // SAFETY: a read of kernel memory through bpf_probe_read_kernel.
        unsafe { bpf_probe_read_kernel(addr as *const u64) }.unwrap_or(0)
    };
    let css_set = read(task + l.task_cgroups);
    if css_set == 0 {
        return false;
    }
    let cgrp = read(css_set + l.cset_dfl_cgrp);
    if cgrp == 0 {
        return false;
    }
    // SAFETY: as in `read`.
    let depth = unsafe { bpf_probe_read_kernel((cgrp + l.cgroup_level) as *const i32) };
    // The workload's own cgroup was tested before (by its id); only deeper ones are below it.
    if !depth.is_ok_and(|d| d > c.workload_level as i32) {
        return false;
    }
    let ancestor = read(cgrp + l.cgroup_ancestors + 8 * c.workload_level as u64);
    let id = if l.ancestors_are_ids != 0 {
        ancestor
    } else if ancestor == 0 {
        0
    } else {
        let kn = read(ancestor + l.cgroup_kn);
        if kn == 0 {
            0
        } else {
            read(kn + l.kn_id)
        }
    };
    id != 0 && id == c.workload_cgroup
}
