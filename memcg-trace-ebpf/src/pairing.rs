//! Pairing an exit with its entry: the pending calls per CPU, claimed and vacated, the calls
//! evicted, the search of the other CPUs, and the deferred pairs userspace confirms.

use crate::*;

/// Hands a pair to userspace for confirmation; false when the ring buffer is full.
#[inline(always)]
pub(crate) fn defer(
    probe: u32,
    ctx: u32,
    start: u64,
    end: u64,
    flags: u8,
    off_ns: u64,
    call: &Pending,
    child_ns: u64,
    child_calls: u64,
    child_off_ns: u64,
) -> bool {
    match DEFERRED.reserve::<Deferred>(0) {
        Some(mut e) => {
            e.write(Deferred {
                start,
                end,
                probe,
                ctx: ctx as u8,
                flags,
                child_calls: child_calls.min(u16::MAX as u64) as u16,
                child_ns,
                off_ns,
                child_off_ns,
                caller: call.caller,
                memcg: call.memcg,
            });
            e.submit(BPF_RB_NO_WAKEUP as u64);
            true
        }
        None => false,
    }
}

/// The pending set of `probe` in CPU state `st` (no lookup: `st` is at hand).
#[inline(always)]
pub(crate) fn pending(st: St, probe: u32) -> Option<&'static mut PendingSet> {
    // SAFETY: per-CPU value; see the module docs for who writes which slot.
    unsafe { (*st.0).pending.get_mut(probe as usize) }
}

/// Claims a task slot's key atomically: from `from` to `to`. Task slots can be claimed from
/// another CPU (the exit of a migrated call) and, on preemptible kernels, by interleaved runs.
#[inline(always)]
pub(crate) fn claim(key: &mut u64, from: u64, to: u64) -> bool {
    if LEGACY {
        if *key == from {
            *key = to;
            return true;
        }
        return false;
    }
    // SAFETY: an aligned u64 in a map value.
    unsafe {
        atomic_cxchg::<u64, { AtomicOrdering::AcqRel }, { AtomicOrdering::Relaxed }>(
            key as *mut u64,
            from,
            to,
        )
    }
    .1
}

/// Sets free task slot `key`'s key to `to`, after the slot's other fields: false when an
/// interleaved run took the slot meanwhile (`atomic`: runs interleave on this CPU). Where they
/// do not, nothing else sets a free slot's key (another CPU's exit only clears the key of the
/// call it finds; `pair_entry` picks a slot whose key it read 0), so the compare-and-swap
/// cannot fail: on x86, whose stores are seen in program order, a plain store then publishes
/// the slot (the `lock or` of `occupy` follows); arm64 keeps the compare-and-swap, whose
/// release orders the fields before the key.
#[inline(always)]
pub(crate) fn publish(key: &mut u64, to: u64, atomic: bool) -> bool {
    if !LEGACY && !atomic && layout().arch == ARCH_X86_64 {
        core::sync::atomic::compiler_fence(core::sync::atomic::Ordering::Release);
        // SAFETY: an aligned u64 in a map value.
        unsafe { core::ptr::write_volatile(key, to) };
        return true;
    }
    claim(key, 0, to)
}

/// `*p |= v` atomically, without fetching the old value: x86's JIT makes it one `lock or`,
/// where it expands the fetching form (what the compiler emits for the intrinsic) into a
/// compare-and-swap loop of about ten instructions. On x86 both are full barriers, which
/// `vacate` relies on. (arm64's JIT makes the non-fetching forms unordered: there the loader
/// must set BPF_FETCH on them, which writes the old value into `v`'s register; so `v` is
/// declared clobbered.)
#[inline(always)]
pub(crate) fn atomic_set_bits(p: *mut u64, v: u64) {
    if LEGACY {
        // SAFETY: as below; only this CPU writes it (see LEGACY).
        unsafe { *p |= v };
        return;
    }
    // SAFETY: `p` is an aligned u64 in a map value (the callers' contract); the instruction
    // reads and writes only it.
    unsafe {
        core::arch::asm!("lock *(u64 *)({p} + 0) |= {v}", p = in(reg) p, v = inout(reg) v => _,
            options(nostack, preserves_flags));
    }
}

/// `*p &= v` atomically, without fetching the old value (as [`atomic_set_bits`]).
#[inline(always)]
pub(crate) fn atomic_keep_bits(p: *mut u64, v: u64) {
    if LEGACY {
        // SAFETY: as in `atomic_set_bits`.
        unsafe { *p &= v };
        return;
    }
    // SAFETY: as in `atomic_set_bits`.
    unsafe {
        core::arch::asm!("lock *(u64 *)({p} + 0) &= {v}", p = in(reg) p, v = inout(reg) v => _,
            options(nostack, preserves_flags));
    }
}

/// Marks task slot `i` of `set` taken (after claiming it).
#[inline(always)]
pub(crate) fn occupy(set: &mut PendingSet, i: usize) {
    atomic_set_bits(&mut set.used, 1 << (i & (TASK_SLOTS - 1)));
}

/// Marks task slot `i` of `set` free (after freeing it), unless it was claimed again meanwhile.
#[inline(always)]
pub(crate) fn vacate(set: &mut PendingSet, i: usize) {
    let i = i & (TASK_SLOTS - 1);
    atomic_keep_bits(&mut set.used, !(1 << i));
    // A claim between the free and the clear set its bit before we cleared it. (The read
    // must not pass the clear: a full barrier on x86, see `atomic_set_bits`.)
    // SAFETY: an aligned u64 in a map value.
    if unsafe { core::ptr::read_volatile(&set.calls[i].key) } != 0 {
        atomic_set_bits(&mut set.used, 1 << i);
    }
}

/// Writes a pending call's call site and charged memcg. Volatile: where both are constant
/// zeros (a plain program), the compiler would otherwise make the two stores a call of a
/// `memset` subprogram.
#[inline(always)]
pub(crate) fn set_origin(p: &mut Pending, caller: u64, memcg: u64) {
    // SAFETY: aligned fields of a live slot.
    unsafe {
        core::ptr::write_volatile(&mut p.caller, caller);
        core::ptr::write_volatile(&mut p.memcg, memcg);
    }
}

/// Entry half: remember the call. `caller`: its call site (`Pending::caller`), 0 without
/// `--callers`; `memcg`: the memcg it charges (`Pending::memcg`), 0 when not read.
#[inline(always)]
pub(crate) fn pair_entry<E: Env>(
    env: &E,
    probe: u32,
    k: Key,
    fentry: bool,
    caller: u64,
    memcg: Charged,
    stack: impl FnOnce(u32),
) {
    let key = k.frame;
    let cpu = env.cpu();
    let atomic = env.atomic();
    let Some(ctx) = env.context() else {
        if let Some(c) = counters(cpu, probe, CTX_TASK) {
            add(&mut c.no_context_entries, 1, atomic);
        }
        return;
    };
    // Counted in the context's cell, found before the call is told apart as the workload's
    // (its exit is counted in its workload cell: userspace adds the two, see `Cell`).
    let Some(set) = pending(env.state(), probe) else {
        return;
    };
    let Some(cs) = counters(cpu, probe, ctx) else {
        return;
    };
    add(&mut cs.entries, 1, atomic);
    if !env.plain() {
        stack(ctx);
    }
    if ctx != CTX_TASK {
        // One call in flight per interrupt context: what is left there is stale.
        let Some(p) = set.calls.get_mut(irq_slot(ctx)) else {
            return;
        };
        if p.key != 0 {
            cs.stale += 1;
        }
        p.ctx = ctx as u16;
        // fentry: the entry program's misses on this CPU now; an exit that finds them moved
        // may be pairing with a stale entry (see pair_exit).
        let (flags, misses) = match fentry.then(|| env.entry_misses(probe)).flatten() {
            Some(m) => (PENDING_MISSES_KNOWN, m),
            None => (0, 0),
        };
        let workload =
            !env.plain() && config().workload_memcg != 0 && memcg_in_workload(probe, memcg);
        p.flags = flags | if workload { PENDING_WORKLOAD } else { 0 };
        p.misses = misses as u32;
        set_origin(p, caller, memcg.id);
        p.key = key;
        nest_enter(env, p, NEST_IRQ, ctx, || env.task());
        p.ts = env.now();
        return;
    }
    let task = env.task();
    // Threads that do interrupt work: task context by the kernel's definition, counted apart.
    match env.thread_kind(task) {
        THREAD_IRQ => add(&mut cs.irq_thread, 1, atomic),
        THREAD_SOFTIRQ => add(&mut cs.softirq_thread, 1, atomic),
        _ => {}
    }
    let switches = env.switches(task);
    let mut flags = if workload_call(env, probe, CTX_TASK, memcg, task) {
        PENDING_WORKLOAD
    } else {
        0
    };
    // Where a call that leaves the CPU would be deferred: the runs the entry program missed on
    // this CPU so far, so that the exit can prove such a call itself (see `pair_exit`).
    let deferrable = if fentry {
        env.fentry_preemptible()
    } else {
        config().kprobe_defers != 0
    };
    let mut misses = 0;
    if deferrable {
        if let Some(m) = env.entry_misses(probe) {
            flags |= PENDING_MISSES_KNOWN;
            misses = m;
        }
    }
    // A pending call at the same frame is stale: frames are unique among calls in flight. Else
    // take a free slot, or evict the oldest call.
    let mut free = TASK_SLOTS;
    let mut oldest = 0;
    let mut oldest_ts = u64::MAX;
    // No slot taken: nothing stale, the first choice is free (the usual case); no search.
    // `used` alone may read 0 with the first choice still taken: another CPU's exit that
    // freed a call here clears its bit and only then looks whether the slot was taken again
    // meanwhile (`vacate`), so its key is read too.
    let hint = k.hint & (TASK_SLOTS - 1);
    // SAFETY: aligned u64s in a map value.
    let none_taken = unsafe {
        core::ptr::read_volatile(&set.used) == 0
            && core::ptr::read_volatile(&set.calls[hint].key) == 0
    };
    if none_taken {
        free = hint;
    }
    // Stale entries and evictions leave the slot's bit set: it is taken again at once.
    for j in 0..TASK_SLOTS {
        if none_taken {
            break;
        }
        let i = (k.hint + j) & (TASK_SLOTS - 1);
        let p = &mut set.calls[i];
        let k = p.key;
        if k == key {
            if claim(&mut p.key, k, 0) {
                add(&mut cs.stale, 1, atomic);
            }
            free = i;
            break;
        }
        if k == 0 {
            if free == TASK_SLOTS {
                free = i;
            }
        } else if p.ts < oldest_ts {
            oldest = i;
            oldest_ts = p.ts;
        }
    }
    if free == TASK_SLOTS {
        let p = &mut set.calls[oldest & (TASK_SLOTS - 1)];
        let k = p.key;
        let victim = p.task;
        if k != 0 && claim(&mut p.key, k, 0) {
            add(&mut cs.evicted, 1, atomic);
            remember_evicted(set, k, victim);
        }
        free = oldest;
    }
    let p = &mut set.calls[free & (TASK_SLOTS - 1)];
    // Written before the key: the slot is only found once its key is set.
    p.task = task;
    p.switches = switches;
    p.migrations = env.migrations(task);
    p.misses = misses as u32;
    p.ctx = CTX_TASK as u16;
    p.flags = flags;
    set_origin(p, caller, memcg.id);
    // Before the timestamp: a call nested from here on is inside this one's time. (A claim
    // below fails only where runs interleave, and nesting is not followed there.)
    nest_enter(env, p, task, CTX_TASK, || task);
    p.ts = env.now();
    // After the timestamp: time off the CPU before it is not part of the call's latency.
    p.clock = env.clock(task);
    if publish(&mut p.key, key, atomic) {
        occupy(set, free);
    } else {
        // Taken meanwhile by an interleaved run (preemptible fentry): this call is not
        // recorded; its exit finds it among the evicted.
        add(&mut cs.evicted, 1, atomic);
        remember_evicted(set, key, task);
    }
}

/// Remembers a task call pushed out of `set` (frame `key`, task `task`), so that its exit is
/// counted as the exit of an evicted call, not lost again as an orphan. Where runs interleave,
/// a race can lose or tear an entry: that exit is then an orphan (counted twice, an upper
/// bound still).
#[inline(always)]
pub(crate) fn remember_evicted(set: &mut PendingSet, key: u64, task: u64) {
    let i = set.evicted_next as usize & (EVICTED_KEPT - 1);
    set.evicted_next = set.evicted_next.wrapping_add(1);
    if let Some(e) = set.evicted.get_mut(i) {
        e.task = task;
        e.key = key;
    }
}

/// Takes the evicted call of frame `key` and task `task` from `set`, if it is remembered there.
#[inline(always)]
pub(crate) fn take_evicted(set: &mut PendingSet, key: u64, task: u64) -> bool {
    for i in 0..EVICTED_KEPT {
        let e = &mut set.evicted[i];
        if e.key == key && e.task == task && claim(&mut e.key, key, 0) {
            return true;
        }
    }
    false
}

/// Slot index `i` (at most `PENDING_SLOTS`) passed through the probe's scratch bytes
/// (`PendingSet::scratch`) and read back, which the verifier takes for any value: the paths
/// that reach a use of the index with different known values continue as one state. With a
/// known index the verifier explored what follows once per value (fentry's exit: 707,195
/// instructions verified of the 1,000,000 it allows, 6.6 s of start-up under emulation).
/// Index `i` goes through byte `i`, which holds nothing else: whatever runs in between (an
/// interrupt's run of the same exit, before 5.12) writes the same value there.
#[inline(always)]
fn opaque_index(set: &mut PendingSet, i: usize) -> usize {
    let i = i & (SCRATCH_BYTES - 1);
    // SAFETY: a byte of this probe's set on this CPU, in bounds (masked above).
    unsafe {
        let w = core::ptr::addr_of_mut!(set.scratch[i]);
        core::ptr::write_volatile(w, i as u8);
        core::ptr::read_volatile(w) as usize
    }
}

/// `pair_exit`'s "the exit's context was not read".
pub(crate) const CTX_NOT_READ: u32 = u32::MAX;

/// Search of the other CPUs' pending sets for a migrated call.
#[repr(C)]
pub(crate) struct Search {
    pub(crate) probe: u32,
    pub(crate) found: u32,
    pub(crate) key: u64,
    pub(crate) task: u64,
    /// The CPU not to search (the exit's own: its slots were looked at already).
    pub(crate) skip: u64,
    /// Only entries made after this time (a local entry's): an older one elsewhere is stale.
    pub(crate) after: u64,
    /// Search the evicted calls (`PendingSet::evicted`) instead of the pending ones: `found` is
    /// then `FOUND_EVICTED` where the call is one of them.
    pub(crate) evicted: u64,
    /// The call found (set with `found`); also the copy of a slot `pair_exit` makes where runs
    /// interleave (one buffer: the program's stack is small).
    pub(crate) call: core::mem::MaybeUninit<Pending>,
}

/// One CPU of the search (a `bpf_loop` callback): claims the call if it is pending there.
unsafe extern "C" fn search_cpu(cpu: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: bpf_loop passes the context it was given.
    let s = unsafe { &mut *(ctx as *mut Search) };
    if cpu == s.skip {
        return 0;
    }
    let zero = 0u32;
    // SAFETY: helper lookup of CPU_STATE's element on another CPU.
    let st = unsafe {
        bpf_map_lookup_percpu_elem(
            &CPU_STATE as *const _ as *mut c_void,
            &zero as *const u32 as *const c_void,
            cpu as u32,
        )
    } as *mut CpuState;
    if st.is_null() {
        return 0;
    }
    // SAFETY: pointer from a successful map lookup.
    let Some(set) = (unsafe { (*st).pending.get_mut(s.probe as usize) }) else {
        return 0;
    };
    if s.evicted != 0 {
        if take_evicted(set, s.key, s.task) {
            s.found = FOUND_EVICTED;
            return 1;
        }
        return 0;
    }
    for i in 0..TASK_SLOTS {
        let p = &mut set.calls[i];
        if p.key == s.key && p.task == s.task && p.ts > s.after {
            let call = *p;
            if claim(&mut p.key, s.key, 0) {
                vacate(set, i);
                s.call.write(call);
                s.found = FOUND_PENDING;
                return 1;
            }
        }
    }
    0
}

/// `Search::found`: the call was pending there (and is now in `Search::call`).
pub(crate) const FOUND_PENDING: u32 = 1;

/// `Search::found`: the call was pushed out of that CPU's set before (`PendingSet::evicted`).
pub(crate) const FOUND_EVICTED: u32 = 2;

/// Exit half: pair with the call's own entry; count what cannot be paired; time the rest.
/// `defer_irq`: the exit program has a recursion guard of its own (fexit), so an interrupt pair
/// is confirmed by userspace.
///
/// In steps, each headed "Step N" below: (1) the exit's own interrupt slot; (2) else the task's
/// slot, unless the task migrated since and its own entry waits on another CPU (the legacy
/// object, which cannot look, counts such an exit ambiguous or an orphan and stops); (3) the
/// slot read in place; (4) else every CPU's pending and then evicted calls (the legacy object:
/// this CPU's evicted ones), or the exit is counted unpaired; (5) the pair counted (an fentry
/// interrupt pair whose entry's CPU missed a run meanwhile counted ambiguous instead); (6) for
/// a task call that left the CPU, its time off it and whether it is proven here or deferred;
/// (7) timed here, or handed to userspace. One
/// function, not seven: the steps share the search buffer and the slot copy on the program's
/// small stack, and moving them into functions of their own changed the compiled programs
/// (by -2% to +2% of their instructions, tried), which must stay the same for this change.
#[inline(always)]
pub(crate) fn pair_exit<E: Env>(env: &E, probe: u32, k: Key, defer_irq: bool) {
    let key = k.frame;
    let now = env.now();
    let cpu = env.cpu();
    let atomic = env.atomic();
    let Some(set) = pending(env.state(), probe) else {
        return;
    };
    // Read on every path, so that the value reaching `switches` is always the task pointer.
    let task = env.task();
    // The call's slot is read in place after it is freed where nothing can take it before
    // this run ends; where runs interleave (`atomic`: fentry on a preemptible kernel), from a
    // copy made before it is freed (in `s.call`). What could write the slot meanwhile:
    // - another CPU: only a migrated call's exit (`search_cpu`), which claims task slots
    //   holding its own key and task, never a freed slot or an interrupt slot;
    // - this CPU, task context: another run only by preemption (`atomic`);
    // - this CPU, an interrupt: its entry program writes the slot of its own context only (an
    //   interrupt context does not nest within itself; so NMIs must be classified as NMIs),
    //   and a kprobe's programs do not run at all while one runs (`bpf_prog_active`);
    // - a traced function reached from this run: none, as long as nothing below allocates
    //   accounted memory (the hash maps are preallocated: a map without preallocation can
    //   charge its elements to a memcg, through `obj_cgroup_charge` on some kernels).
    // Its fields are written only where it is used: the copy (`call`), or a search.
    let mut s = core::mem::MaybeUninit::<Search>::uninit();
    let sp = s.as_mut_ptr();
    // SAFETY: the address of a field of a local, not a read of it.
    let copy = unsafe { core::ptr::addr_of_mut!((*sp).call) } as *mut Pending;
    let mut call: *const Pending = copy;
    // The slot found here (`PENDING_SLOTS`: none).
    let mut slot = PENDING_SLOTS;
    let mut found = false;
    let mut migrated = false;
    // The exit's own context, read only where an interrupt slot holds this frame
    // (`CTX_NOT_READ`: not read yet; `CTX_UNKNOWN`: unreadable). Plain words, not `Option`s:
    // an `Option`'s unset payload can reach the stack uninitialised, which verifiers before
    // 6.x refuse to read (5.10 did, for this function).
    let mut own_ctx: u32 = CTX_NOT_READ;

    // Step 1. Interrupt contexts first: their calls are the innermost. A slot holding this
    // frame is this exit's only if it is the slot of the exit's own context: on x86_64
    // hardirqs and the softirqs run at their end share the irq stack, so a hardirq entry whose
    // exit was skipped can sit at the frame a later softirq call exits at (that entry is
    // stale: the hardirq context's next entry counts it).
    let mut irq_frame = false;
    for ctx in [CTX_NMI, CTX_HARDIRQ, CTX_SOFTIRQ] {
        if let Some(p) = set.calls.get(irq_slot(ctx)) {
            irq_frame |= p.key == key;
        }
    }
    if irq_frame {
        let c = env.context();
        own_ctx = c.unwrap_or(CTX_UNKNOWN);
        if let Some(c) = c.filter(|&c| c != CTX_TASK) {
            if let Some(p) = set.calls.get_mut(irq_slot(c)) {
                if p.key == key {
                    if atomic {
                        // SAFETY: the copy buffer, a local.
                        unsafe { copy.write(*p) };
                    }
                    p.key = 0;
                    slot = irq_slot(c);
                    found = true;
                }
            }
        }
    }

    // Step 2. The task slot holding this task and frame (where the task migrated since that
    // entry, the legacy object ends the run here). The task's switch count now, where one does
    // (`switches_read`).
    let mut switches_now: u64 = 0;
    let mut switches_read = false;
    // Whether that count differs from the entry's (read with it; see Step 5).
    let mut moved = false;
    if !found {
        // The task slot holding this task and frame (`TASK_SLOTS`: none).
        let mut found_at = TASK_SLOTS;
        for j in 0..TASK_SLOTS {
            let i = (k.hint + j) & (TASK_SLOTS - 1);
            let p = &set.calls[i];
            if p.key == key && p.task == task {
                found_at = i;
                break;
            }
        }
        // fentry searches from slot 0 (`Key::fentry`): each iteration's match would reach the
        // rest of the function with its own constant index, every path explored once per slot.
        let mut have = found_at < TASK_SLOTS;
        let local = opaque_index(set, found_at) & (TASK_SLOTS - 1);
        if have {
            let p = &set.calls[local];
            let sw = env.switches(task);
            switches_now = sw;
            switches_read = true;
            moved = sw != p.switches;
            // The task moved to another CPU since this entry: the entry may be stale (its
            // call exited there, or its exit was lost) while this exit's own entry waits on
            // the CPU the call began on. The newer entry there wins; with none, this is a
            // call that left and came back.
            if moved && env.migrations(task) != p.migrations {
                let after = p.ts;
                let workload = p.flags & PENDING_WORKLOAD != 0;
                let mut own_elsewhere = false;
                if !LEGACY {
                    // SAFETY: the search's buffer, a local.
                    own_elsewhere =
                        unsafe { search_all(sp, probe, key, task, cpu as u64, after, 0) } != 0;
                }
                if own_elsewhere || LEGACY {
                    // The key the match was made on: an interleaved run may have taken the
                    // slot for another call since.
                    let claimed = claim(&mut set.calls[local].key, key, 0);
                    if claimed {
                        vacate(set, local);
                        if own_elsewhere {
                            if let Some(c) = counters(cpu, probe, CTX_TASK) {
                                add(&mut c.stale, 1, atomic);
                            }
                        }
                    }
                    if !own_elsewhere {
                        // The legacy object cannot look: neither half is timed (counted where
                        // the call's exit would have been).
                        if let Some(c) = cell_of(cpu, probe, CTX_TASK, workload, env.plain()) {
                            add(&mut c.counters.exits, 1, atomic);
                            if claimed {
                                add(&mut c.counters.ambiguous, 1, atomic);
                            } else {
                                add(&mut c.counters.orphans, 1, atomic);
                            }
                        }
                        return;
                    }
                    found = true;
                    migrated = true;
                    have = false;
                }
            }
        }
        if have {
            let p = &mut set.calls[local];
            if atomic {
                // SAFETY: the copy buffer, a local.
                unsafe { copy.write(*p) };
            }
            if claim(&mut p.key, key, 0) {
                vacate(set, local);
                slot = local;
                found = true;
            }
        }
    }

    // Step 3. Found here, runs not interleaving: the slot read in place.
    if found && !atomic && !migrated {
        // In place (the index made opaque: each slot's path reaches the code below as one).
        let slot = opaque_index(set, slot);
        let Some(p) = set.calls.get(slot) else {
            return;
        };
        call = p;
    }

    // Step 4. Not pending here: a task call that migrated (found on another CPU), an evicted
    // call's exit, or an exit whose entry was lost (counted unpaired).
    if !found {
        let read = if own_ctx == CTX_NOT_READ {
            env.context()
        } else if own_ctx == CTX_UNKNOWN {
            None
        } else {
            Some(own_ctx)
        };
        let ctx = match read {
            Some(c) => c,
            None => {
                if let Some(c) = counters(cpu, probe, CTX_TASK) {
                    add(&mut c.no_context_exits, 1, atomic);
                }
                return;
            }
        };
        // The call may have been pushed out of a full set (on this CPU, or on the one it began
        // on): it is lost, counted once, as evicted.
        let mut evicted = false;
        if ctx == CTX_TASK && !LEGACY {
            // The pending calls of every CPU, then (an exit of a call pending anywhere is that
            // call's) the evicted ones.
            for pass in 0..2u64 {
                // SAFETY: the search's buffer, a local.
                let found_as = unsafe { search_all(sp, probe, key, task, u64::MAX, 0, pass) };
                if found_as == FOUND_PENDING {
                    found = true;
                    migrated = true;
                    break;
                }
                if found_as == FOUND_EVICTED {
                    evicted = true;
                    break;
                }
            }
        } else if ctx == CTX_TASK {
            // The legacy object cannot look at other CPUs: this one's only.
            evicted = take_evicted(set, key, task);
        }
        if evicted {
            if let Some(c) = counters(cpu, probe, ctx) {
                add(&mut c.exits, 1, atomic);
                add(&mut c.evicted_exits, 1, atomic);
            }
            return;
        }
        if !found {
            // An exit without its entry while the entry program is not attached is a call that
            // began (or ends) outside the tracing window, not a lost one.
            // SAFETY: pointer from a successful map lookup.
            let open = WINDOW.get_ptr(probe).map(|w| unsafe { *w }) == Some(WINDOW_OPEN);
            if let Some(c) = counters(cpu, probe, ctx) {
                add(&mut c.exits, 1, atomic);
                if open || env.testing() {
                    add(&mut c.orphans, 1, atomic);
                } else {
                    add(&mut c.outside, 1, atomic);
                }
            }
            return;
        }
    }

    // Step 5. The pair, counted (an fentry interrupt pair whose entry's CPU missed a run
    // meanwhile, as ambiguous).
    // SAFETY: set above with `found` (to the slot, which no other run takes before this one
    // ends, or to the copy).
    let call = unsafe { &*call };
    let ctx = call.ctx as u32 & (NUM_CTX as u32 - 1);
    let Some(c) = cell_of(
        cpu,
        probe,
        ctx,
        call.flags & PENDING_WORKLOAD != 0,
        env.plain(),
    ) else {
        return;
    };
    let cs = &mut c.counters;
    add(&mut cs.exits, 1, atomic);
    // A task call that left the CPU: other tasks ran there meanwhile. Found in its own slot
    // here with runs not interleaving, `call` is the slot Step 2 compared: its answer holds.
    let switched = ctx == CTX_TASK
        && (migrated
            || if switches_read && !atomic {
                moved
            } else if switches_read {
                switches_now != call.switches
            } else {
                env.switches(task) != call.switches
            });
    // This CPU's nesting sums are set back whatever happens below; the call's duration is
    // added for the enclosing call only if the call is counted.
    let nested = nest_exit(env, call, !migrated);
    if call.ts > now {
        // Cannot happen for a real pair; never a sample.
        add(&mut cs.orphans, 1, atomic);
        return;
    }
    let ns = now - call.ts;
    // A call whose nesting was not seen counts whole (`u64::MAX`: unknown).
    let child = if nested.child_ns <= ns {
        nested.child_ns
    } else {
        u64::MAX
    };
    let child_calls = nested.child_calls;
    let mut flags = 0u8;
    if call.flags & PENDING_WORKLOAD != 0 {
        flags |= DEFERRED_WORKLOAD;
    }
    let mut deferred = false;
    if ctx != CTX_TASK && defer_irq {
        // An fentry interrupt pair is a stale entry joined with another call's exit only if the
        // entry program skipped that call's entry on this CPU in between, which moves its
        // misses there. Unmoved: this is the call's own entry. Moved: not counted. Unknown:
        // userspace decides (coarser).
        match (call.flags & PENDING_MISSES_KNOWN != 0)
            .then(|| env.entry_misses(probe))
            .flatten()
        {
            Some(m) if m as u32 == call.misses => {}
            Some(_) => {
                add(&mut cs.ambiguous, 1, atomic);
                return;
            }
            None => deferred = true,
        }
    }

    // Step 6. A task call that left the CPU: its time off it, proven here or deferred.
    let mut off = 0;
    if ctx == CTX_TASK {
        if switched {
            flags |= DEFERRED_SWITCHED;
            add(&mut cs.switched, 1, atomic);
            if migrated {
                flags |= DEFERRED_MIGRATED;
                add(&mut cs.migrated, 1, atomic);
                if !env.cross_cpu_clock() {
                    flags |= DEFERRED_OFF_UNKNOWN;
                }
            }
            if flags & DEFERRED_OFF_UNKNOWN == 0 {
                match off_cpu(call.clock, env.clock(task), ns) {
                    Some(o) => off = o,
                    None => flags |= DEFERRED_OFF_UNKNOWN,
                }
            }
            // `defer_irq`: the fexit program (whose runs can interleave where `preemptible`).
            deferred = if defer_irq {
                env.fentry_preemptible()
            } else {
                config().kprobe_defers != 0
            };
            // Proven here instead: an entry of this task skipped while the call was in flight
            // was skipped on a CPU the task ran on. Never moved: only this one, whose count of
            // the entry program's missed runs did not move either. (A migrated call's other
            // CPUs are not known: deferred.)
            if deferred
                && !migrated
                && call.flags & PENDING_MISSES_KNOWN != 0
                && env.migrations(task) == call.migrations
                && env.entry_misses(probe).map(|m| m as u32) == Some(call.misses)
            {
                deferred = false;
                add(&mut cs.proven_on_cpu, 1, atomic);
            }
            if !deferred {
                if flags & DEFERRED_OFF_UNKNOWN != 0 {
                    add(&mut cs.off_cpu_unknown, 1, atomic);
                } else {
                    add(&mut cs.off_cpu_ns, off, atomic);
                    raise(&mut cs.off_cpu_max_ns, off, atomic);
                }
            }
        }
    }

    // Step 7. Timed here, or handed to userspace.
    // Its enclosing call's time holds this one's, once it is counted here or handed to
    // userspace (a deferred call's too: its pairing is rejected only when a stale entry joined
    // another call's exit, both traced calls inside the enclosing one; userspace reports what
    // such a call took from its enclosing call's self time). A pair lost on the way (the ring
    // buffer full) takes nothing from it.
    if !nested.enclosed {
        flags |= DEFERRED_OUTERMOST;
    }
    // What its nested calls spent off the CPU: part of its own time off it (at most all of
    // it), known where its self time and time off are.
    let child_off = if child == u64::MAX || off == 0 {
        0
    } else {
        nested.child_off.min(off)
    };
    if deferred {
        if defer(
            probe,
            ctx,
            call.ts,
            now,
            flags,
            off,
            call,
            child,
            child_calls,
            child_off,
        ) {
            add(&mut cs.deferred, 1, atomic);
            if nested.enclosed {
                nest_done(env, ns, off);
            }
        } else {
            add(&mut cs.deferred_lost, 1, atomic);
        }
        return;
    }
    if nested.enclosed {
        nest_done(env, ns, off);
    }
    add(&mut cs.paired, 1, atomic);
    if flags & DEFERRED_OUTERMOST != 0 {
        add(&mut cs.outermost_ns, ns, atomic);
    }
    let (self_ns, nested) = if child == u64::MAX {
        add(&mut cs.self_unknown, 1, atomic);
        (ns, 0)
    } else {
        (ns - child, child_calls)
    };
    record(&mut c.hist, ns, self_ns, nested, off, child_off, atomic);
    if !env.plain() && config().callers != 0 {
        count_caller(cs, cpu, probe, ctx, call.caller, ns);
    }
    if !env.plain() && config().by_memcg != 0 {
        count_memcg(cs, cpu, probe, ctx, call.memcg, ns, true);
    }
}

/// Every CPU's pending calls (`evicted` 0) or evicted ones (1) but CPU `skip`'s (`u64::MAX`:
/// none skipped) searched for this task's call at `key`, entries made before `after` left
/// out: `FOUND_PENDING` (the call is then in the buffer's `call`), `FOUND_EVICTED`, or 0.
///
/// # Safety
/// `sp` is the search buffer of the running program (a local).
#[inline(always)]
unsafe fn search_all(
    sp: *mut Search,
    probe: u32,
    key: u64,
    task: u64,
    skip: u64,
    after: u64,
    evicted: u64,
) -> u32 {
    // SAFETY: the search's inputs are written before the loop, and the callback only touches
    // the context passed here; `found` is read after it.
    unsafe {
        core::ptr::addr_of_mut!((*sp).probe).write(probe);
        core::ptr::addr_of_mut!((*sp).found).write(0);
        core::ptr::addr_of_mut!((*sp).key).write(key);
        core::ptr::addr_of_mut!((*sp).task).write(task);
        core::ptr::addr_of_mut!((*sp).skip).write(skip);
        core::ptr::addr_of_mut!((*sp).after).write(after);
        core::ptr::addr_of_mut!((*sp).evicted).write(evicted);
        bpf_loop(
            config().cpus,
            search_cpu as *mut c_void,
            sp as *mut c_void,
            0,
        );
        (*sp).found
    }
}

/// A run that could not find this CPU's state (per-CPU base not verified): counted, nothing
/// recorded.
#[inline(always)]
pub(crate) fn no_state(probe: u32, exit: bool) {
    // SAFETY: helper without preconditions.
    let cpu = unsafe { bpf_get_smp_processor_id() };
    if let Some(c) = counters(cpu, probe, CTX_TASK) {
        if exit {
            add(&mut c.no_context_exits, 1, true);
        } else {
            add(&mut c.no_context_entries, 1, true);
        }
    }
}

/// Whether a tracepoint hit in context `ctx` is the workload's (as `workload_call`, the task
/// read only where it is needed). A function, not a closure: the compiler made the closure a
/// subprogram with its captures passed through the stack, about twenty instructions a hit.
#[inline(always)]
pub(crate) fn tp_workload(env: &Kernel, probe: u32, memcg: Charged, ctx: u32) -> bool {
    let cfg = config();
    if cfg.workload_memcg != 0 && memcg.id != 0 {
        memcg_in_workload(probe, memcg)
    } else {
        ctx == CTX_TASK && cfg.workload_cgroup != 0 && env.in_workload(env.task())
    }
}

/// Tracepoint half: counts and context, no latency.
#[inline(always)]
pub(crate) fn on_hit<C: EbpfContext>(c: &C, probe: u32) -> u32 {
    let Some(st) = cpu_state(c) else {
        no_state(probe, false);
        return 0;
    };
    let env = Kernel {
        st,
        preemptible: false,
        patched: false,
        plain: false,
    };
    let cfg = config();
    let memcg = if cfg.by_memcg != 0 || cfg.workload_memcg != 0 {
        charged_memcg(st, probe, first_arg(c.as_ptr()), true)
    } else {
        Charged::id(0)
    };
    match env.context() {
        Some(ctx) if cfg.tp_percpu != 0 => {
            let i = (probe as usize * NUM_CTX + (ctx as usize & (NUM_CTX - 1))) & (TP_CELLS - 1);
            // SAFETY: this CPU's state (no lookup of its own), and a tracepoint program is not
            // preempted.
            let hits = unsafe { &mut (*st.0).tp_hits[i] };
            hits[0] += 1;
            if tp_workload(&env, probe, memcg, ctx) {
                hits[1] += 1;
            }
            if cfg.by_memcg != 0 {
                if let Some(cs) = counters(st.cpu(), probe, ctx) {
                    count_memcg(cs, st.cpu(), probe, ctx, memcg.id, 0, false);
                }
            }
        }
        Some(ctx) => {
            if let Some(cs) = counters(st.cpu(), probe, ctx) {
                cs.entries += 1;
                if tp_workload(&env, probe, memcg, ctx) {
                    cs.workload_hits += 1;
                }
                if cfg.by_memcg != 0 {
                    count_memcg(cs, st.cpu(), probe, ctx, memcg.id, 0, false);
                }
            }
        }
        None => {
            if let Some(cs) = counters(st.cpu(), probe, CTX_TASK) {
                cs.no_context_entries += 1;
            }
        }
    }
    0
}

/// A call's identity: its frame, and the task slot to look in first.
#[derive(Clone, Copy)]
pub(crate) struct Key {
    pub(crate) frame: u64,
    pub(crate) hint: usize,
}

impl Key {
    /// fentry/fexit: the trampoline's argument area, the same address for the entry and exit
    /// programs of one call. The verifier forbids arithmetic on a context pointer, so the slots
    /// are searched from the first.
    #[inline(always)]
    pub(crate) fn fentry<C: EbpfContext>(ctx: &C) -> Key {
        Key {
            frame: ctx.as_ptr() as u64,
            hint: 0,
        }
    }

    /// kprobe: the stack pointer at entry.
    #[inline(always)]
    pub(crate) fn kprobe(ctx: &ProbeContext) -> Key {
        let frame = reg_sp(ctx.regs as *const c_void);
        Key {
            frame,
            hint: task_slot_hint(frame),
        }
    }

    /// kretprobe: on x86 the return address was popped, so the stack pointer is 8 bytes above
    /// the entry's; on arm64 it came in a register, and the stack pointer is the entry's.
    #[inline(always)]
    pub(crate) fn kretprobe(ctx: &RetProbeContext) -> Key {
        let sp = reg_sp(ctx.regs as *const c_void);
        let frame = if layout().arch == ARCH_ARM64 {
            sp
        } else {
            sp.wrapping_sub(8)
        };
        Key {
            frame,
            hint: task_slot_hint(frame),
        }
    }

    /// The self-test's given frame.
    #[inline(always)]
    pub(crate) fn given(frame: u64) -> Key {
        Key {
            frame,
            hint: task_slot_hint(frame),
        }
    }
}
