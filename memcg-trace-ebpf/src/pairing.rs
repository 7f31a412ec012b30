//! Pairing an exit with its entry: the pending calls per CPU, claimed and vacated, the calls
//! evicted, the search of the other CPUs, and the deferred pairs userspace confirms.

use crate::*;

#[macro_use]
mod steps;

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
    // SAFETY: this CPU's state; see the module docs for who writes which slot.
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

/// Frees task slot `key`, which holds `from`, at the exit of its call on the CPU it entered
/// on: false when another run took it meanwhile (`atomic`: runs interleave on this CPU).
/// Where they do not, nothing else writes that key: another CPU's exit claims only slots
/// holding its own task (running there, not here), this CPU's entries do not run during this
/// run, and an interrupt's entry takes its context's slot only; so on x86 a plain store frees
/// it (about 7 instructions fewer a call than the compare-and-swap, 6.12). arm64 keeps the
/// compare-and-swap, as in `publish`.
#[inline(always)]
pub(crate) fn release(key: &mut u64, from: u64, atomic: bool) -> bool {
    if !LEGACY && !atomic && layout().arch == ARCH_X86_64 {
        // SAFETY: an aligned u64 in a map value.
        unsafe { core::ptr::write_volatile(key, 0) };
        return true;
    }
    claim(key, from, 0)
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

/// [`vacate`] by the exit of a call on the CPU it entered on: where runs do not interleave
/// there (`atomic` false), only this CPU's entries claim a free slot and none runs meanwhile,
/// so the bit is cleared without looking again.
#[inline(always)]
pub(crate) fn vacate_own(set: &mut PendingSet, i: usize, atomic: bool) {
    if atomic {
        vacate(set, i);
        return;
    }
    atomic_keep_bits(&mut set.used, !(1 << (i & (TASK_SLOTS - 1))));
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
    let Some(set) = pending(env.state(), probe) else {
        return;
    };
    // The context's counters, looked up only where a rarer event is counted there.
    let cs = || counters(cpu, probe, ctx);
    if !env.plain() {
        stack(ctx);
    }
    // Counted in the pending set, next to `used` (see `PendingSet::entries`); userspace adds
    // it to the context's cell (the exit of a workload's call goes to its workload cell:
    // userspace adds the two, see `Cell`). In each branch below, so that a task call's index
    // is a constant.
    // An interrupt context's call: its context's own slot (the step ends the run).
    if ctx != CTX_TASK {
        add(&mut set.entries[ctx as usize & (NUM_CTX - 1)], 1, atomic);
        enter_interrupt!(env, probe, key, ctx, fentry, caller, memcg, set, cs);
    }
    add(&mut set.entries[CTX_TASK as usize], 1, atomic);
    let task = env.task();
    // Threads that do interrupt work: task context by the kernel's definition, counted apart.
    match env.thread_kind(task) {
        THREAD_IRQ => cs().map(|c| add(&mut c.irq_thread, 1, atomic)),
        THREAD_SOFTIRQ => cs().map(|c| add(&mut c.softirq_thread, 1, atomic)),
        _ => None,
    };
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
    // A task's call: the slot it takes.
    take_task_slot!(k, key, atomic, set, cs; free);
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
        if let Some(c) = cs() {
            add(&mut c.evicted, 1, atomic);
        }
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
    // That CPU's state.
    let Some(st) = CPU_STATE.get_ptr_mut(cpu as u32) else {
        return 0;
    };
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
/// In steps, those longer than a few lines macros of `steps.rs` named for what they do (Step 3
/// and most of Step 5 are here): (1) the exit's own interrupt
/// slot; (2) else the task's slot, unless the task migrated since and its own entry waits on
/// another CPU (the legacy object, which cannot look, counts such an exit ambiguous or an
/// orphan and stops); (3) the slot read in place; (4) else every CPU's pending and then
/// evicted calls (the legacy object: this CPU's evicted ones), or the exit is counted
/// unpaired; (5) the pair counted (an fentry interrupt pair whose entry's CPU missed a run
/// meanwhile counted ambiguous instead); (6) for a task call that left the CPU, its time off it
/// and whether it is proven here or deferred; (7) timed here, or handed to userspace. Each
/// step's arguments are the locals it reads, then after `;` those it sets.
///
/// What could write the call's slot between its claim and this run's end:
/// - another CPU: only a migrated call's exit (`search_cpu`), which claims task slots holding
///   its own key and task, never a freed slot or an interrupt slot;
/// - this CPU, task context: another run only by preemption (`atomic`);
/// - this CPU, an interrupt: its entry program writes the slot of its own context only (an
///   interrupt context does not nest within itself; so NMIs must be classified as NMIs), and a
///   kprobe's programs do not run at all while one runs (`bpf_prog_active`);
/// - a traced function reached from this run: none, as long as nothing below allocates
///   accounted memory (the hash maps are preallocated: a map without preallocation can charge
///   its elements to a memcg, through `obj_cgroup_charge` on some kernels).
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
    // this run ends (see the doc above); where runs interleave (`atomic`: fentry on a
    // preemptible kernel), from a copy made before it is freed (in `s.call`). Its fields are
    // written only where it is used: the copy (`call`), or a search.
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

    // Step 1. The exit's own interrupt slot.
    find_interrupt_slot!(env, key, atomic, set, copy; own_ctx, slot, found);

    // Step 2. The task slot holding this task and frame. The task's switch count now, where
    // one was read (`switches_read`).
    let mut switches_now: u64 = 0;
    let mut switches_read = false;
    // Whether that count differs from the entry's (read with it; see Step 5).
    let mut moved = false;
    if !found {
        find_task_slot!(
            env, probe, cpu, k, key, task, atomic, set, sp, copy;
            slot, found, migrated, switches_now, switches_read, moved
        );
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
        search_elsewhere!(env, probe, cpu, key, task, atomic, set, sp, own_ctx; found, migrated);
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
    // A task call that left the CPU: other tasks ran there meanwhile.
    let switched = left_the_cpu!(
        env,
        ctx,
        call,
        task,
        atomic,
        migrated,
        switches_now,
        switches_read,
        moved
    );
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
        check_interrupt_entry!(env, probe, call, atomic, cs; deferred);
    }

    // Step 6. A task call that left the CPU: its time off it, proven here or deferred.
    let mut off = 0;
    if ctx == CTX_TASK {
        time_off_cpu!(
            env, probe, task, atomic, defer_irq, call, cs, ns, migrated, switched;
            flags, off, deferred
        );
    }

    // Step 7. Timed here, or handed to userspace.
    time_or_defer!(
        env, probe, cpu, ctx, now, atomic, call, c, cs,
        nested, ns, child, child_calls, off, deferred;
        flags
    );
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
