//! What a task call spent off the CPU: the task's switch counts and the scheduler's clock, read
//! as plain loads where the verifier allows.

use crate::*;

/// The u64 field at offset marker `MARKER` (a [`LeanField::marker`]) of the kernel struct at
/// `base`, for the patched programs: one plain load, whose offset the loader rewrites into the
/// field's (`patch::lean_fields`), instead of the offset's load from the read-only layout and
/// an add. `base` is a pointer the verifier knows the BTF type of (the task from
/// `current_task`, or a pointer loaded from it), so it checks the load against that type as it
/// would the layout's offset. Never merged with another read (not `pure`): a re-read reads.
#[inline(always)]
pub(crate) fn lean_load<const MARKER: i16>(base: u64) -> u64 {
    let v: u64;
    // SAFETY: one load from a verifier-typed pointer at an offset inside its type (checked at
    // load); an unrewritten marker is a negative offset the verifier refuses.
    unsafe {
        // (The assembler takes a negative offset as a subtraction.)
        core::arch::asm!("{v} = *(u64 *)({b} - {neg})", v = lateout(reg) v, b = in(reg) base,
            neg = const -(MARKER as i32), options(nostack, readonly, preserves_flags));
    }
    v
}

/// `nvcsw + nivcsw` of `task` (from `current_task`): changes whenever the task leaves the CPU.
/// Two counters, each a word the scheduler only increments: no read can make a switch up.
#[inline(always)]
pub(crate) fn read_switches(task: u64, patched: bool) -> u64 {
    if patched {
        return lean_load::<{ LeanField::Nvcsw.marker() }>(task)
            .wrapping_add(lean_load::<{ LeanField::Nivcsw.marker() }>(task));
    }
    let l = layout();
    if l.direct_task == 0 && l.switches_adjacent != 0 {
        // One helper call instead of two: nivcsw follows nvcsw in every kernel so far.
        // SAFETY: a read of kernel memory through bpf_probe_read_kernel.
        let [v, iv]: [u64; 2] =
            unsafe { bpf_probe_read_kernel((task + l.task_nvcsw) as *const [u64; 2]) }
                .unwrap_or([0, 0]);
        return v.wrapping_add(iv);
    }
    read_task_u64(l, task, l.task_nvcsw, false).wrapping_add(read_task_u64(
        l,
        task,
        l.task_nivcsw,
        false,
    ))
}

/// The off-CPU clock of `task` (from `current_task`): `se.exec_start - se.sum_exec_runtime`,
/// which moves by exactly the time the task is away from the CPU (see
/// `memcg_trace_common::off_cpu`). The scheduler updates the two together, and can do so
/// between this program's two reads: a tick on this CPU interrupting it, or another CPU reading
/// the task's runtime. Every update moves `exec_start`, so a pair is taken only when
/// `exec_start` reads the same before and after `sum_exec_runtime` (a second try at most).
/// That check cannot see one interleaving: the scheduler stores `exec_start` before
/// `sum_exec_runtime`, so an update from another CPU (`task_sched_runtime`, under this CPU's
/// runqueue lock) whose first store lands before our first read and whose second lands after
/// our read of the sum gives (new `exec_start`, old sum): off by the task's runtime since its
/// last update. Both our reads must fall in the few instructions between its two stores; the
/// result is then either beyond the call's wall time, which `off_cpu` makes unknown, or inside
/// it and wrong. (On arm64 the plain loads of a direct read may also be reordered.) No
/// sequence count guards the pair in the kernel, so no reader can do better.
#[inline(always)]
pub(crate) fn read_off_clock(task: u64, patched: bool) -> u64 {
    if patched {
        return off_clock_of(
            (
                lean_load::<{ LeanField::ExecStart.marker() }>(task),
                lean_load::<{ LeanField::SumExec.marker() }>(task),
            ),
            || lean_load::<{ LeanField::ExecStart.marker() }>(task),
            || lean_load::<{ LeanField::SumExec.marker() }>(task),
        );
    }
    let l = layout();
    let (xo, so) = (l.task_exec_start, l.task_sum_exec);
    let first = if l.direct_task == 0 && l.clock_adjacent != 0 {
        // One helper call for both: sum_exec_runtime follows exec_start in every kernel so far.
        // SAFETY: a read of kernel memory through bpf_probe_read_kernel.
        let [x, s]: [u64; 2] =
            unsafe { bpf_probe_read_kernel((task + xo) as *const [u64; 2]) }.unwrap_or([0, 0]);
        (x, s)
    } else {
        let x = read_task_u64(l, task, xo, false);
        (x, read_task_u64(l, task, so, false))
    };
    off_clock_of(
        first,
        || read_task_u64(l, task, xo, false),
        || read_task_u64(l, task, so, false),
    )
}

/// [`read_off_clock`]'s retry: `first` the (`exec_start`, `sum_exec_runtime`) read, then
/// `exec_start` re-read until it holds still (twice at most), the sum re-read after each move.
#[inline(always)]
fn off_clock_of(
    first: (u64, u64),
    exec_start: impl Fn() -> u64,
    sum_exec: impl Fn() -> u64,
) -> u64 {
    let (mut x, mut s) = first;
    for _ in 0..2 {
        let again = exec_start();
        if again == x {
            break;
        }
        x = again;
        s = sum_exec();
    }
    x.wrapping_sub(s)
}

/// A u64 of `task` (from `current_task`) at offset `off`: a plain load where the layout allows
/// (volatile, so that two reads of one field stay two reads), else the fault-safe helper.
#[inline(always)]
pub(crate) fn read_task_u64(l: &KernelLayout, task: u64, off: u64, patched: bool) -> u64 {
    if patched || l.direct_task != 0 {
        // SAFETY: the verifier's trusted task_struct pointer; it checks the load against the
        // type.
        return unsafe {
            core::ptr::read_volatile((task as *const u8).add(off as usize) as *const u64)
        };
    }
    // SAFETY: a read of kernel memory through bpf_probe_read_kernel.
    unsafe { bpf_probe_read_kernel((task + off) as *const u64) }.unwrap_or(0)
}

/// A u32 of `task` (from `current_task`) at offset `off`, as [`read_task_u64`] reads a u64.
#[inline(always)]
pub(crate) fn read_task_u32(l: &KernelLayout, task: u64, off: u64, patched: bool) -> u32 {
    if patched || l.direct_task != 0 {
        // SAFETY: as in read_task_u64.
        return unsafe {
            core::ptr::read_volatile((task as *const u8).add(off as usize) as *const u32)
        };
    }
    // SAFETY: a read of kernel memory through bpf_probe_read_kernel.
    unsafe { bpf_probe_read_kernel((task + off) as *const u32) }.unwrap_or(0)
}
