//! Calls inside calls: the outermost and the self time, and the time off the CPU of nested
//! calls.

use crate::*;

/// Gives a call that is entering its number, notes this CPU's nesting state in its slot
/// (before its timestamp: a call nested from here on is inside its time), and makes it the
/// innermost open call; `owner`: its task, or `NEST_IRQ` (see [`Nest`]). `ctx`: its context
/// (what may be open below it is read from every probe's pending calls, only if a call is
/// noted open: see [`open_on_cpu`]); `task`: the task the call runs in or interrupted (read
/// only if an open task call is noted here).
#[inline(always)]
pub(crate) fn nest_enter<E: Env>(
    env: &E,
    p: &mut Pending,
    owner: u64,
    ctx: u32,
    task: impl FnOnce() -> u64,
) {
    let Some(n) = env.nest() else {
        return;
    };
    // The slot's last call is the open one: it was dropped as stale or evicted just now, or
    // its exit was on another CPU (a call that exited here set the state back to what it
    // noted, so it is not open).
    let dead = n.owner != NEST_NONE && n.top == p.nest_id;
    let id = n.seq.wrapping_add(1);
    n.seq = id;
    p.nest_id = id;
    p.nest_ns = n.ns;
    p.nest_calls = n.calls;
    p.nest_off = n.off;
    match if dead {
        None
    } else {
        encloses(n.owner, || open_on_cpu(env.state(), ctx), task)
    } {
        Some(enclosed) => {
            p.nest_owner = n.owner;
            p.nest_top = n.top;
            if enclosed {
                p.flags |= PENDING_ENCLOSED;
            }
        }
        // Left open by a call that cannot be running: this call (and what it restores at its
        // exit) starts from "none open".
        None => {
            p.nest_owner = NEST_NONE;
            p.nest_top = 0;
        }
    }
    n.owner = owner;
    n.top = id;
}

/// What may be open on a CPU when a call enters there, from its pending calls of every probe
/// (the innermost open call may be another probe's: `charge` encloses `try_charge`).
#[derive(Clone, Copy)]
pub(crate) struct Open {
    /// A task slot is taken (`PendingSet::used`).
    pub(crate) task: bool,
    /// The slot of an interrupt context below the entering call's is taken (task calls:
    /// false).
    pub(crate) lower_irq: bool,
}

/// [`Open`] for a call of context `ctx` entering on the CPU whose state is `st` (before it
/// takes its own slot): a look at each probe in use, a load or three each.
#[inline(always)]
pub(crate) fn open_on_cpu(st: St, ctx: u32) -> Open {
    let mut open = Open {
        task: false,
        lower_irq: false,
    };
    let probes = config().probes;
    for probe in 0..MAX_PROBES as u32 {
        if probe >= probes {
            break;
        }
        let Some(set) = pending(st, probe) else {
            break;
        };
        // SAFETY: an aligned u64 in a map value.
        if unsafe { core::ptr::read_volatile(&set.used) } != 0 {
            open.task = true;
        }
        for c in CTX_SOFTIRQ..CTX_NMI {
            if c < ctx && set.calls[irq_slot(c)].key != 0 {
                open.lower_irq = true;
            }
        }
    }
    open
}

/// Whether the innermost open call noted on this CPU, `owner`'s, encloses a call entering now
/// (`task`: the task that call runs in or interrupted); `None` when the open call cannot be
/// running any more (its exit was on another CPU, or lost).
#[inline(always)]
pub(crate) fn encloses(
    owner: u64,
    open: impl FnOnce() -> Open,
    task: impl FnOnce() -> u64,
) -> Option<bool> {
    match owner {
        NEST_NONE => Some(false),
        // Task code does not run while an interrupt call is open on its CPU; an interrupt call
        // runs inside one of a lower context only, which is still in its slot.
        NEST_IRQ => open().lower_irq.then_some(true),
        // A task's call is pending in a task slot of this CPU while it is open here. It encloses
        // its own task's calls, and interrupt calls only while it runs: an interrupt of another
        // task is not inside its time.
        t => open().task.then(|| t == task()),
    }
}

/// What ran nested in a call, found at its exit.
pub(crate) struct Nested {
    /// The traced calls nested in it, ns (`u64::MAX`: unknown).
    pub(crate) child_ns: u64,
    /// How many.
    pub(crate) child_calls: u64,
    /// Their time off the CPU, ns (meaningful where `child_ns` is known).
    pub(crate) child_off: u64,
    /// Whether an open traced call encloses it (else it is outermost).
    pub(crate) enclosed: bool,
}

/// At the exit of `call`: what ran nested in it, from the growth of this CPU's
/// sums since its entry, known only if it is still the innermost open call (see [`Nest`]).
/// The state is set back to what it was at its entry whatever happens (the call itself is
/// added by `nest_done` once it is counted, if it was enclosed at entry). `here`: the
/// call entered on this CPU (a migrated call's exit leaves this CPU's state alone).
#[inline(always)]
pub(crate) fn nest_exit<E: Env>(env: &E, call: &Pending, here: bool) -> Nested {
    let mut r = Nested {
        child_ns: u64::MAX,
        child_calls: 0,
        child_off: 0,
        enclosed: false,
    };
    if !here {
        return r;
    }
    let Some(n) = env.nest() else {
        return r;
    };
    r.enclosed = call.flags & PENDING_ENCLOSED != 0;
    if n.top == call.nest_id && n.calls == call.nest_calls {
        // Still the innermost open call, and no call was counted inside it: the sums are
        // still what it noted (after the last write of `top` to this call, by its entry or by
        // the exit of a call that noted it as top, the sums move only by `nest_done`, which
        // adds to `calls` too), so only the open call is set back. Like every update of the
        // state, this assumes no other program's run lands between a run's words: an
        // interrupt call landing inside another exit's restore (a window of an instruction or
        // two) can leave the sums moved with `calls` set back; if that exit is then counted
        // ambiguous (no `nest_done`), the call below takes this path and the interrupt call's
        // time stays in the sums. The full path errs in other such windows (an interrupt call
        // inside an entry's noting goes to the entering call's child time).
        r.child_ns = 0;
        n.owner = call.nest_owner;
        n.top = call.nest_top;
        return r;
    }
    if n.top == call.nest_id {
        r.child_ns = n.ns.wrapping_sub(call.nest_ns);
        r.child_calls = n.calls.wrapping_sub(call.nest_calls);
        r.child_off = n.off.wrapping_sub(call.nest_off);
    }
    n.ns = call.nest_ns;
    n.calls = call.nest_calls;
    n.off = call.nest_off;
    n.owner = call.nest_owner;
    n.top = call.nest_top;
    r
}

/// Adds a counted call's duration and time off the CPU to this CPU's sums, for its enclosing
/// call (after `nest_exit` found one on the CPU it entered).
#[inline(always)]
pub(crate) fn nest_done<E: Env>(env: &E, ns: u64, off: u64) {
    if let Some(n) = env.nest() {
        n.ns = n.ns.wrapping_add(ns);
        n.calls = n.calls.wrapping_add(1);
        n.off = n.off.wrapping_add(off);
    }
}
