//! The steps of `pair_entry` and `pair_exit`, each a macro named for what it does.
//!
//! Macros, not functions: a step expands to the very statements it names, on the caller's
//! locals (its arguments: those it reads, then after `;` those it sets), so the programs'
//! instructions stay those of the one function the verifiers of every kernel accepted and the
//! bench measured. The same steps as inlined functions of their own moved 1-3 instructions in
//! up to 49 of the 129 programs of an object (tried: the compiler lays the code out anew).
//! Within a step, `return` ends the program's run.

/// `pair_entry`, an interrupt context's call: one call in flight per interrupt context, in the
/// context's own slot; what is left there is stale. Ends the run.
macro_rules! enter_interrupt {
    (
        $env:ident,
        $probe:ident,
        $key:ident,
        $ctx:ident,
        $fentry:ident,
        $caller:ident,
        $memcg:ident,
        $set:ident,
        $cs:ident
    ) => {
        let Some(p) = $set.calls.get_mut(irq_slot($ctx)) else {
            return;
        };
        if p.key != 0 {
            if let Some(c) = $cs() {
                c.stale += 1;
            }
        }
        p.ctx = $ctx as u16;
        // fentry: the entry program's misses on this CPU now; an exit that finds them moved
        // may be pairing with a stale entry (see pair_exit).
        let (flags, misses) = match $fentry.then(|| $env.entry_misses($probe)).flatten() {
            Some(m) => (PENDING_MISSES_KNOWN, m),
            None => (0, 0),
        };
        let workload =
            !$env.plain() && config().workload_memcg != 0 && memcg_in_workload($probe, $memcg);
        p.flags = flags | if workload { PENDING_WORKLOAD } else { 0 };
        p.misses = misses as u32;
        set_origin(p, $caller, $memcg.id);
        p.key = $key;
        nest_enter($env, p, NEST_IRQ, $ctx, || $env.task());
        p.ts = $env.now();
        return;
    };
}

/// `pair_entry`, a task's call: the slot it takes (declares `free`). A pending call at the same
/// frame is stale: frames are unique among calls in flight. Else a free slot, or the oldest
/// call's, evicted.
macro_rules! take_task_slot {
    ($k:ident, $key:ident, $atomic:ident, $set:ident, $cs:ident; $free:ident) => {
        let mut $free = TASK_SLOTS;
        let mut oldest = 0;
        let mut oldest_ts = u64::MAX;
        // No slot taken: nothing stale, the first choice is free (the usual case); no search.
        // `used` alone may read 0 with the first choice still taken: another CPU's exit that
        // freed a call here clears its bit and only then looks whether the slot was taken again
        // meanwhile (`vacate`), so its key is read too.
        let hint = $k.hint & (TASK_SLOTS - 1);
        // SAFETY: aligned u64s in a map value.
        let none_taken = unsafe {
            core::ptr::read_volatile(&$set.used) == 0
                && core::ptr::read_volatile(&$set.calls[hint].key) == 0
        };
        if none_taken {
            $free = hint;
        }
        // Stale entries and evictions leave the slot's bit set: it is taken again at once.
        for j in 0..TASK_SLOTS {
            if none_taken {
                break;
            }
            let i = ($k.hint + j) & (TASK_SLOTS - 1);
            let p = &mut $set.calls[i];
            let held = p.key;
            if held == $key {
                if claim(&mut p.key, held, 0) {
                    if let Some(c) = $cs() {
                        add(&mut c.stale, 1, $atomic);
                    }
                }
                $free = i;
                break;
            }
            if held == 0 {
                if $free == TASK_SLOTS {
                    $free = i;
                }
            } else if p.ts < oldest_ts {
                oldest = i;
                oldest_ts = p.ts;
            }
        }
        if $free == TASK_SLOTS {
            let p = &mut $set.calls[oldest & (TASK_SLOTS - 1)];
            let held = p.key;
            let victim = p.task;
            if held != 0 && claim(&mut p.key, held, 0) {
                if let Some(c) = $cs() {
                    add(&mut c.evicted, 1, $atomic);
                }
                remember_evicted($set, held, victim);
            }
            $free = oldest;
        }
    };
}

/// `pair_exit` Step 1. Interrupt contexts first: their calls are the innermost. A slot holding
/// this frame is this exit's only if it is the slot of the exit's own context: on x86_64
/// hardirqs and the softirqs run at their end share the irq stack, so a hardirq entry whose
/// exit was skipped can sit at the frame a later softirq call exits at (that entry is stale:
/// the hardirq context's next entry counts it). Sets `own_ctx` where it reads the context,
/// and `slot` and `found` where the call is there.
macro_rules! find_interrupt_slot {
    (
        $env:ident,
        $key:ident,
        $atomic:ident,
        $set:ident,
        $copy:ident;
        $own_ctx:ident,
        $slot:ident,
        $found:ident
    ) => {
        let mut irq_frame = false;
        for ctx in [CTX_NMI, CTX_HARDIRQ, CTX_SOFTIRQ] {
            if let Some(p) = $set.calls.get(irq_slot(ctx)) {
                irq_frame |= p.key == $key;
            }
        }
        if irq_frame {
            let c = $env.context();
            $own_ctx = c.unwrap_or(CTX_UNKNOWN);
            if let Some(c) = c.filter(|&c| c != CTX_TASK) {
                if let Some(p) = $set.calls.get_mut(irq_slot(c)) {
                    if p.key == $key {
                        if $atomic {
                            // SAFETY: the copy buffer, a local.
                            unsafe { $copy.write(*p) };
                        }
                        p.key = 0;
                        $slot = irq_slot(c);
                        $found = true;
                    }
                }
            }
        }
    };
}

/// `pair_exit` Step 2. The task slot holding this task and frame; where the task migrated
/// since that entry, the entry may be stale while this exit's own entry waits on the CPU the
/// call began on (found there: `migrated`; the legacy object, which cannot look, counts the
/// exit ambiguous or an orphan and ends the run). Sets `slot` and `found` where it claims the
/// call here, the task's switch count now where it reads one (`switches_now`,
/// `switches_read`) and whether it differs from the entry's (`moved`).
macro_rules! find_task_slot {
    (
        $env:ident,
        $probe:ident,
        $cpu:ident,
        $k:ident,
        $key:ident,
        $task:ident,
        $atomic:ident,
        $set:ident,
        $sp:ident,
        $copy:ident;
        $slot:ident,
        $found:ident,
        $migrated:ident,
        $switches_now:ident,
        $switches_read:ident,
        $moved:ident
    ) => {
        // The task slot holding this task and frame (`TASK_SLOTS`: none).
        let mut found_at = TASK_SLOTS;
        for j in 0..TASK_SLOTS {
            let i = ($k.hint + j) & (TASK_SLOTS - 1);
            let p = &$set.calls[i];
            if p.key == $key && p.task == $task {
                found_at = i;
                break;
            }
        }
        // fentry searches from slot 0 (`Key::fentry`): each iteration's match would reach the
        // rest of the function with its own constant index, every path explored once per slot.
        let mut have = found_at < TASK_SLOTS;
        let local = opaque_index($set, found_at) & (TASK_SLOTS - 1);
        if have {
            let p = &$set.calls[local];
            let sw = $env.switches($task);
            $switches_now = sw;
            $switches_read = true;
            $moved = sw != p.switches;
            // The task moved to another CPU since this entry: the entry may be stale (its
            // call exited there, or its exit was lost) while this exit's own entry waits on
            // the CPU the call began on. The newer entry there wins; with none, this is a
            // call that left and came back.
            if $moved && $env.migrations($task) != p.migrations {
                let after = p.ts;
                let workload = p.flags & PENDING_WORKLOAD != 0;
                let mut own_elsewhere = false;
                if !LEGACY {
                    // SAFETY: the search's buffer, a local.
                    own_elsewhere =
                        unsafe { search_all($sp, $probe, $key, $task, $cpu as u64, after, 0) } != 0;
                }
                if own_elsewhere || LEGACY {
                    // The key the match was made on: an interleaved run may have taken the
                    // slot for another call since.
                    let claimed = claim(&mut $set.calls[local].key, $key, 0);
                    if claimed {
                        vacate($set, local);
                        if own_elsewhere {
                            if let Some(c) = counters($cpu, $probe, CTX_TASK) {
                                add(&mut c.stale, 1, $atomic);
                            }
                        }
                    }
                    if !own_elsewhere {
                        // The legacy object cannot look: neither half is timed (counted where
                        // the call's exit would have been).
                        if let Some(c) = cell_of($cpu, $probe, CTX_TASK, workload, $env.plain()) {
                            add(&mut c.counters.exits, 1, $atomic);
                            if claimed {
                                add(&mut c.counters.ambiguous, 1, $atomic);
                            } else {
                                add(&mut c.counters.orphans, 1, $atomic);
                            }
                        }
                        return;
                    }
                    $found = true;
                    $migrated = true;
                    have = false;
                }
            }
        }
        if have {
            let p = &mut $set.calls[local];
            if $atomic {
                // SAFETY: the copy buffer, a local.
                unsafe { $copy.write(*p) };
            }
            if release(&mut p.key, $key, $atomic) {
                vacate_own($set, local, $atomic);
                $slot = local;
                $found = true;
            }
        }
    };
}

/// `pair_exit` Step 4. Not pending here: a task call that migrated (found on another CPU:
/// `found`, `migrated`), an evicted call's exit, or an exit whose entry was lost (counted
/// unpaired); the last two end the run, as does an exit whose context cannot be read (counted
/// as such).
macro_rules! search_elsewhere {
    (
        $env:ident,
        $probe:ident,
        $cpu:ident,
        $key:ident,
        $task:ident,
        $atomic:ident,
        $set:ident,
        $sp:ident,
        $own_ctx:ident;
        $found:ident,
        $migrated:ident
    ) => {
        let read = if $own_ctx == CTX_NOT_READ {
            $env.context()
        } else if $own_ctx == CTX_UNKNOWN {
            None
        } else {
            Some($own_ctx)
        };
        let ctx = match read {
            Some(c) => c,
            None => {
                if let Some(c) = counters($cpu, $probe, CTX_TASK) {
                    add(&mut c.no_context_exits, 1, $atomic);
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
                let found_as = unsafe { search_all($sp, $probe, $key, $task, u64::MAX, 0, pass) };
                if found_as == FOUND_PENDING {
                    $found = true;
                    $migrated = true;
                    break;
                }
                if found_as == FOUND_EVICTED {
                    evicted = true;
                    break;
                }
            }
        } else if ctx == CTX_TASK {
            // The legacy object cannot look at other CPUs: this one's only.
            evicted = take_evicted($set, $key, $task);
        }
        if evicted {
            if let Some(c) = counters($cpu, $probe, ctx) {
                add(&mut c.exits, 1, $atomic);
                add(&mut c.evicted_exits, 1, $atomic);
            }
            return;
        }
        if !$found {
            // An exit without its entry while the entry program is not attached is a call that
            // began (or ends) outside the tracing window, not a lost one.
            // SAFETY: pointer from a successful map lookup.
            let open = WINDOW.get_ptr($probe).map(|w| unsafe { *w }) == Some(WINDOW_OPEN);
            if let Some(c) = counters($cpu, $probe, ctx) {
                add(&mut c.exits, 1, $atomic);
                if open || $env.testing() {
                    add(&mut c.orphans, 1, $atomic);
                } else {
                    add(&mut c.outside, 1, $atomic);
                }
            }
            return;
        }
    };
}

/// `pair_exit` Step 5: whether a task call left the CPU (other tasks ran there meanwhile).
/// Found in its own slot here with runs not interleaving, `call` is the slot Step 2 compared:
/// its answer holds.
macro_rules! left_the_cpu {
    (
        $env:ident,
        $ctx:ident,
        $call:ident,
        $task:ident,
        $atomic:ident,
        $migrated:ident,
        $switches_now:ident,
        $switches_read:ident,
        $moved:ident
    ) => {
        $ctx == CTX_TASK
            && ($migrated
                || if $switches_read && !$atomic {
                    $moved
                } else if $switches_read {
                    $switches_now != $call.switches
                } else {
                    $env.switches($task) != $call.switches
                })
    };
}

/// `pair_exit` Step 5, an fentry interrupt pair: a stale entry joined with another call's
/// exit only if the entry program skipped that call's entry on this CPU in between, which
/// moves its misses there. Unmoved: this is the call's own entry. Moved: counted ambiguous,
/// and the run ends. Unknown: userspace decides (coarser; sets `deferred`).
macro_rules! check_interrupt_entry {
    ($env:ident, $probe:ident, $call:ident, $atomic:ident, $cs:ident; $deferred:ident) => {
        match ($call.flags & PENDING_MISSES_KNOWN != 0)
            .then(|| $env.entry_misses($probe))
            .flatten()
        {
            Some(m) if m as u32 == $call.misses => {}
            Some(_) => {
                add(&mut $cs.ambiguous, 1, $atomic);
                return;
            }
            None => $deferred = true,
        }
    };
}

/// `pair_exit` Step 6. A task call that left the CPU: its time off it (`off`, or its flag
/// unknown), and whether it is proven here or handed to userspace (`deferred`).
macro_rules! time_off_cpu {
    (
        $env:ident,
        $probe:ident,
        $task:ident,
        $atomic:ident,
        $defer_irq:ident,
        $call:ident,
        $cs:ident,
        $ns:ident,
        $migrated:ident,
        $switched:ident;
        $flags:ident,
        $off:ident,
        $deferred:ident
    ) => {
        if $switched {
            $flags |= DEFERRED_SWITCHED;
            add(&mut $cs.switched, 1, $atomic);
            if $migrated {
                $flags |= DEFERRED_MIGRATED;
                add(&mut $cs.migrated, 1, $atomic);
                if !$env.cross_cpu_clock() {
                    $flags |= DEFERRED_OFF_UNKNOWN;
                }
            }
            if $flags & DEFERRED_OFF_UNKNOWN == 0 {
                match off_cpu($call.clock, $env.clock($task), $ns) {
                    Some(o) => $off = o,
                    None => $flags |= DEFERRED_OFF_UNKNOWN,
                }
            }
            // `defer_irq`: the fexit program (whose runs can interleave where `preemptible`).
            $deferred = if $defer_irq {
                $env.fentry_preemptible()
            } else {
                config().kprobe_defers != 0
            };
            // Proven here instead: an entry of this task skipped while the call was in flight
            // was skipped on a CPU the task ran on. Never moved: only this one, whose count of
            // the entry program's missed runs did not move either. (A migrated call's other
            // CPUs are not known: deferred.)
            if $deferred
                && !$migrated
                && $call.flags & PENDING_MISSES_KNOWN != 0
                && $env.migrations($task) == $call.migrations
                && $env.entry_misses($probe).map(|m| m as u32) == Some($call.misses)
            {
                $deferred = false;
                add(&mut $cs.proven_on_cpu, 1, $atomic);
            }
            if !$deferred {
                if $flags & DEFERRED_OFF_UNKNOWN != 0 {
                    add(&mut $cs.off_cpu_unknown, 1, $atomic);
                } else {
                    add(&mut $cs.off_cpu_ns, $off, $atomic);
                    raise(&mut $cs.off_cpu_max_ns, $off, $atomic);
                }
            }
        }
    };
}

/// `pair_exit` Step 7. Timed here, or handed to userspace (which ends the run there). Its
/// enclosing call's time holds this one's, once it is counted here or handed to userspace (a
/// deferred call's too: its pairing is rejected only when a stale entry joined another call's
/// exit, both traced calls inside the enclosing one; userspace reports what such a call took
/// from its enclosing call's self time). A pair lost on the way (the ring buffer full) takes
/// nothing from it.
macro_rules! time_or_defer {
    (
        $env:ident,
        $probe:ident,
        $cpu:ident,
        $ctx:ident,
        $now:ident,
        $atomic:ident,
        $call:ident,
        $c:ident,
        $cs:ident,
        $nested:ident,
        $ns:ident,
        $child:ident,
        $child_calls:ident,
        $off:ident,
        $deferred:ident;
        $flags:ident
    ) => {
        if !$nested.enclosed {
            $flags |= DEFERRED_OUTERMOST;
        }
        // What its nested calls spent off the CPU: part of its own time off it (at most all of
        // it), known where its self time and time off are.
        let child_off = if $child == u64::MAX || $off == 0 {
            0
        } else {
            $nested.child_off.min($off)
        };
        if $deferred {
            if defer(
                $probe,
                $ctx,
                $call.ts,
                $now,
                $flags,
                $off,
                $call,
                $child,
                $child_calls,
                child_off,
            ) {
                add(&mut $cs.deferred, 1, $atomic);
                if $nested.enclosed {
                    nest_done($env, $ns, $off);
                }
            } else {
                add(&mut $cs.deferred_lost, 1, $atomic);
            }
            return;
        }
        if $nested.enclosed {
            nest_done($env, $ns, $off);
        }
        add(&mut $cs.paired, 1, $atomic);
        if $flags & DEFERRED_OUTERMOST != 0 {
            add(&mut $cs.outermost_ns, $ns, $atomic);
        }
        let (self_ns, nested_calls) = if $child == u64::MAX {
            add(&mut $cs.self_unknown, 1, $atomic);
            ($ns, 0)
        } else {
            ($ns - $child, $child_calls)
        };
        record(
            &mut $c.hist,
            $ns,
            self_ns,
            nested_calls,
            $off,
            child_off,
            $atomic,
        );
        if !$env.plain() && config().callers != 0 {
            count_caller($cs, $cpu, $probe, $ctx, $call.caller, $ns);
        }
        if !$env.plain() && config().by_memcg != 0 {
            count_memcg($cs, $cpu, $probe, $ctx, $call.memcg, $ns, true);
        }
    };
}
