//! The memcg a call charges: read from its argument (with a per-CPU memo), and whether it is the
//! workload's.

use crate::*;

/// The memcg a call charges: its id, and where its `kernfs_node` is (0: not read), from which
/// its parents are found.
#[derive(Clone, Copy)]
pub(crate) struct Charged {
    pub(crate) id: u64,
    pub(crate) kn: u64,
    /// Whether it is the workload's, where already known (`MEMCG_IN_WORKLOAD`,
    /// `MEMCG_OUTSIDE`; 0: not judged yet).
    pub(crate) verdict: u64,
}

impl Charged {
    /// Not read (no path, or a null pointer on it), or another controller's.
    pub(crate) const fn id(id: u64) -> Charged {
        Charged {
            id,
            kn: 0,
            verdict: 0,
        }
    }
}

/// The memcg a call of `probe` charges, from its first argument `arg` along the probe's
/// `MEMCG_PATH` (fault-safe reads); id 0 when the probe has no path or a pointer on it is
/// null. `memo`: the last call's result on this CPU may be used and kept (in `st`,
/// `CpuState::memcg_memo`). Not
/// where runs of the program interleave on a CPU by preemption (fentry on preemptible
/// kernels): the sequence word keeps a nested run's read or write whole, not a read preempted
/// across two whole writes that leave the same word.
#[inline(always)]
pub(crate) fn charged_memcg(st: St, probe: u32, arg: u64, memo: bool) -> Charged {
    // SAFETY: pointer from a successful map lookup; written by userspace before attaching.
    // By reference, each field loaded where it is read: a copy made the compiler load all
    // fourteen and keep them on the stack, for the memo's hit too, which reads two.
    let Some(path) = MEMCG_PATH.get_ptr(probe).map(|p| unsafe { &*p }) else {
        return Charged::id(0);
    };
    if path.hops == 0 {
        return Charged::id(0);
    }
    if arg == 0 {
        // A null css is no memcg's.
        return Charged::id(if path.check_hops != 0 { NOT_A_MEMCG } else { 0 });
    }
    let hop = kernel_u64(arg.wrapping_add(path.off[0] as i64 as u64));
    let memo = if memo { st.memcg_memo(probe) } else { None };
    if let Some(m) = memo {
        if let Some(c) = memo_hit(m, arg, hop, path.id_off) {
            return c;
        }
    }
    let mut found = chase_memcg(path, arg, hop);
    if let Some(m) = memo {
        if found.id != 0 {
            if config().workload_memcg != 0 {
                found.verdict = workload_verdict(probe, found);
            }
            memo_keep(m, arg, hop, found);
        }
    }
    found
}

/// The memcg memo `m` holds for argument `arg` whose first hop read `hop`, if it holds it and
/// was not being written (see `MemcgMemo::seq`), and its kernfs node at `id_off` still reads
/// its id.
#[inline(always)]
pub(crate) fn memo_hit(m: *mut MemcgMemo, arg: u64, hop: u64, id_off: u32) -> Option<Charged> {
    // SAFETY: this CPU's element of CPU_STATE; volatile, so that the reads of the sequence
    // word come before and after the others.
    unsafe {
        let seq = core::ptr::read_volatile(core::ptr::addr_of!((*m).seq));
        let held = core::ptr::read_volatile(core::ptr::addr_of!((*m).arg));
        let held_hop = core::ptr::read_volatile(core::ptr::addr_of!((*m).hop));
        if seq & 1 != 0 || held != arg || held_hop != hop || hop == 0 {
            return None;
        }
        let c = Charged {
            id: core::ptr::read_volatile(core::ptr::addr_of!((*m).id)),
            kn: core::ptr::read_volatile(core::ptr::addr_of!((*m).kn)),
            verdict: core::ptr::read_volatile(core::ptr::addr_of!((*m).verdict)),
        };
        if core::ptr::read_volatile(core::ptr::addr_of!((*m).seq)) != seq {
            return None;
        }
        // The other controllers' css (no memcg, no node) are told by the check alone.
        // (A fault reads 0, never a memcg's id.)
        if c.kn != 0 && kernel_u64(c.kn + id_off as u64) != c.id {
            return None;
        }
        Some(c)
    }
}

/// Writes `found`, reached from `arg` whose first hop read `hop`, into the memo `m`, unless a
/// run this one interrupted is writing it.
#[inline(always)]
pub(crate) fn memo_keep(m: *mut MemcgMemo, arg: u64, hop: u64, found: Charged) {
    // SAFETY: as in `memo_hit`; the sequence word is odd from before the first field written
    // to after the last.
    unsafe {
        let seq = core::ptr::read_volatile(core::ptr::addr_of!((*m).seq));
        if seq & 1 != 0 {
            return;
        }
        core::ptr::write_volatile(core::ptr::addr_of_mut!((*m).seq), seq | 1);
        core::ptr::write_volatile(core::ptr::addr_of_mut!((*m).arg), arg);
        core::ptr::write_volatile(core::ptr::addr_of_mut!((*m).hop), hop);
        core::ptr::write_volatile(core::ptr::addr_of_mut!((*m).id), found.id);
        core::ptr::write_volatile(core::ptr::addr_of_mut!((*m).kn), found.kn);
        core::ptr::write_volatile(core::ptr::addr_of_mut!((*m).verdict), found.verdict);
        core::ptr::write_volatile(core::ptr::addr_of_mut!((*m).seq), seq.wrapping_add(2));
    }
}

/// The rest of `charged_memcg`'s chase from argument `arg`, whose first hop read `hop`: the
/// check (another controller's css is not a memcg), then the hops left and the id.
#[inline(always)]
pub(crate) fn chase_memcg(path: &MemcgPath, arg: u64, hop: u64) -> Charged {
    if path.check_hops != 0 {
        let mut c = arg;
        for i in 0..2 {
            if i as u32 >= path.check_hops {
                break;
            }
            if c == 0 {
                return Charged::id(NOT_A_MEMCG);
            }
            c = kernel_u64(c.wrapping_add(path.check_off[i] as i64 as u64));
        }
        // A null struct (a css without a controller) fails the check, and so does a fault (a
        // helper's read tells one; a cast load would read 0, which may be the bits wanted).
        let v = match c {
            0 => None,
            // SAFETY: a fault-safe read of kernel memory.
            c => unsafe { bpf_probe_read_kernel((c + path.check_field as u64) as *const u32) }.ok(),
        };
        if v.map(|v| v & path.check_mask) != Some(path.check_want) {
            return Charged::id(NOT_A_MEMCG);
        }
    }
    let mut p = hop;
    for i in 1..MEMCG_HOPS {
        if i as u32 >= path.hops {
            break;
        }
        if p == 0 {
            return Charged::id(0);
        }
        p = kernel_u64(p.wrapping_add(path.off[i] as i64 as u64));
    }
    if p == 0 {
        return Charged::id(0);
    }
    let id = kernel_u64(p + path.id_off as u64);
    Charged {
        id,
        kn: p,
        verdict: 0,
    }
}

/// The first argument of a function (fentry) or BTF tracepoint from the program's context
/// `ctx`, as a plain number: a load from the context would give the verifier's typed pointer,
/// on which the path's offsets (from a map, so not constants) are not allowed.
#[inline(always)]
pub(crate) fn first_arg(ctx: *mut c_void) -> u64 {
    kernel_u64(ctx as u64)
}

/// Whether memcg `m`, charged by a call of `probe`, is the workload's or one of its
/// descendants (`Config::workload_memcg`): the verdict in `WORKLOAD_MEMCGS`, or, for a memcg
/// it does not hold yet (one made since userspace last looked, or one that is not the
/// workload's), the verdict of a climb through its parents, kept for the next call.
#[inline(always)]
pub(crate) fn memcg_in_workload(probe: u32, m: Charged) -> bool {
    let v = if m.verdict != 0 {
        m.verdict
    } else {
        workload_verdict(probe, m)
    };
    v == MEMCG_IN_WORKLOAD as u64
}

/// `memcg_in_workload`'s verdict on `m` (`MEMCG_IN_WORKLOAD`, `MEMCG_OUTSIDE`; 0: not known).
#[inline(always)]
pub(crate) fn workload_verdict(probe: u32, m: Charged) -> u64 {
    if m.id == 0 {
        return 0;
    }
    // SAFETY: a lookup of a plain value.
    if let Some(v) = unsafe { WORKLOAD_MEMCGS.get(&m.id) } {
        return *v as u64;
    }
    match climb(probe, m) {
        Some(v) => {
            // Never over userspace's verdict (set meanwhile): BPF_NOEXIST.
            let _ = WORKLOAD_MEMCGS.insert(&m.id, &v, 1);
            v as u64
        }
        None => 0,
    }
}

/// The verdict on memcg `m`: in the workload if it is the workload's memcg; else from its
/// parents (up to `MEMCG_CLIMB`, from its `kernfs_node`): in the workload if the workload's
/// memcg comes first, or a parent already judged in it; outside if the root (a null parent) or
/// a parent judged outside comes first (a memcg below the workload's meets it before any memcg
/// outside it). None when unread, or deeper than the climb (such a memcg pays the climb again
/// at each call: none is that deep in practice).
#[inline(always)]
pub(crate) fn climb(probe: u32, m: Charged) -> Option<u8> {
    // SAFETY: pointers from successful map lookups; written by userspace before attaching.
    let root = WORKLOAD_ROOT.get_ptr(0).map(|p| unsafe { *p })?;
    // The workload's own memcg (its verdict pushed out of the LRU map, or not put in yet).
    if root != 0 && m.id == root {
        return Some(MEMCG_IN_WORKLOAD);
    }
    let path = MEMCG_PATH.get_ptr(probe).map(|p| unsafe { *p })?;
    if m.kn == 0 || root == 0 || path.parent_off == 0 {
        return None;
    }
    let mut at = m.kn;
    for _ in 0..MEMCG_CLIMB {
        // SAFETY: fault-safe reads of kernel memory.
        at = unsafe { bpf_probe_read_kernel((at + path.parent_off as u64) as *const u64) }.ok()?;
        if at == 0 {
            return Some(MEMCG_OUTSIDE);
        }
        let id = unsafe { bpf_probe_read_kernel((at + path.id_off as u64) as *const u64) }.ok()?;
        if id == root {
            return Some(MEMCG_IN_WORKLOAD);
        }
        // SAFETY: a lookup of a plain value.
        if let Some(v) = unsafe { WORKLOAD_MEMCGS.get(&id) } {
            return Some(*v);
        }
    }
    None
}

/// Whether a call belongs to the workload: by the memcg it charges (`memcg`, where
/// `Config::workload_memcg` says so and it was read), else by the cgroup of the task making it
/// (task context only).
#[inline(always)]
pub(crate) fn workload_call<E: Env>(
    env: &E,
    probe: u32,
    ctx: u32,
    memcg: Charged,
    task: u64,
) -> bool {
    let c = config();
    if !env.plain() && c.workload_memcg != 0 && memcg.id != 0 {
        return memcg_in_workload(probe, memcg);
    }
    ctx == CTX_TASK && env.in_workload(task)
}
