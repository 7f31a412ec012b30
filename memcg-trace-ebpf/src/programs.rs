//! The programs: one fentry/fexit, kprobe/kretprobe and tracepoint set per probe slot, the
//! floor pairs, the switch witness, the context check, the program statistics iterator.

use crate::*;

/// The probe slot `$n` of a program, hidden from the optimiser: every slot's programs then
/// compile to the same instructions but for the one that loads this constant, so the floor,
/// measured with a spare slot's programs, times the very code a traced slot runs (folded in,
/// the slots' programs differed in length, slot 0's by up to 33 instructions, and the floor's
/// window was a few instructions off; `slot_programs_are_one_code` in userspace checks it). The
/// verifier still knows the value: a move of an immediate, made by the asm itself (an empty
/// asm block would give the next instruction two line records, which the kernel refuses where
/// the line info is kept, `--ebpf-log`).
macro_rules! slot {
    ($n:expr) => {{
        let v: u64;
        // SAFETY: one move of a constant into a register.
        unsafe {
            core::arch::asm!(
                "{0} = {1}",
                out(reg) v,
                const $n,
                options(pure, nomem, nostack, preserves_flags)
            );
        }
        v as u32
    }};
}

/// The entry program of probe slot `$n` on context `$ctx` (fentry); `$patched`: a patched
/// program (`Kernel::patched`, taken only where runs do not interleave on a CPU); `$plain`:
/// built for the plain settings (`Env::plain`).
macro_rules! fentry_body {
    ($ctx:ident, $n:expr, $patched:expr, $plain:expr) => {{
        let n = slot!($n);
        if let Some(st) = cpu_state(&$ctx) {
            let env = Kernel {
                st,
                preemptible: !$patched,
                patched: $patched,
                plain: $plain,
            };
            let caller = if !env.plain && config().callers != 0 {
                fentry_caller(&$ctx)
            } else {
                0
            };
            let memcg = if !env.plain && (config().by_memcg != 0 || config().workload_memcg != 0) {
                charged_memcg(st, n, first_arg($ctx.as_ptr()), !env.atomic())
            } else {
                Charged::id(0)
            };
            let stack = |c: u32| sample_stack(&$ctx, st, n, c, caller);
            pair_entry(&env, n, Key::fentry(&$ctx), true, caller, memcg, stack);
        } else {
            no_state(n, false);
        }
        0
    }};
}

/// The exit program of probe slot `$n` (fexit), as [`fentry_body`].
macro_rules! fexit_body {
    ($ctx:ident, $n:expr, $patched:expr, $plain:expr) => {{
        let n = slot!($n);
        if let Some(st) = cpu_state(&$ctx) {
            let env = Kernel {
                st,
                preemptible: !$patched,
                patched: $patched,
                plain: $plain,
            };
            pair_exit(&env, n, Key::fentry(&$ctx), true);
        } else {
            no_state(n, true);
        }
        0
    }};
}

/// Probe slot `$n`'s programs: the fentry/fexit pair in its three builds (general, patched,
/// lean: `names::FENTRY`, `FENTRY_PATCHED`, `FENTRY_LEAN`), kprobe/kretprobe, tp_btf.
macro_rules! probe_slot {
    ($n:expr, $fentry:ident, $fexit:ident, $fentry_patched:ident, $fexit_patched:ident,
     $fentry_lean:ident, $fexit_lean:ident, $kprobe:ident, $kretprobe:ident, $tp:ident) => {
        #[fentry]
        pub fn $fentry(ctx: FEntryContext) -> u32 {
            fentry_body!(ctx, $n, false, false)
        }
        #[fexit]
        pub fn $fexit(ctx: FExitContext) -> u32 {
            fexit_body!(ctx, $n, false, false)
        }
        #[fentry]
        pub fn $fentry_patched(ctx: FEntryContext) -> u32 {
            fentry_body!(ctx, $n, true, false)
        }
        #[fexit]
        pub fn $fexit_patched(ctx: FExitContext) -> u32 {
            fexit_body!(ctx, $n, true, false)
        }
        #[fentry]
        pub fn $fentry_lean(ctx: FEntryContext) -> u32 {
            fentry_body!(ctx, $n, true, true)
        }
        #[fexit]
        pub fn $fexit_lean(ctx: FExitContext) -> u32 {
            fexit_body!(ctx, $n, true, true)
        }
        #[kprobe]
        pub fn $kprobe(ctx: ProbeContext) -> u32 {
            let n = slot!($n);
            if let Some(st) = cpu_state(&ctx) {
                let env = Kernel {
                    st,
                    preemptible: false,
                    patched: false,
                    plain: false,
                };
                let caller = if config().callers != 0 {
                    kprobe_caller(&ctx)
                } else {
                    0
                };
                let memcg = if config().by_memcg != 0 || config().workload_memcg != 0 {
                    charged_memcg(st, n, reg_arg0(ctx.regs as *const c_void), true)
                } else {
                    Charged::id(0)
                };
                let stack = |c: u32| sample_stack(&ctx, st, n, c, caller);
                pair_entry(&env, n, Key::kprobe(&ctx), false, caller, memcg, stack);
            } else {
                no_state(n, false);
            }
            0
        }
        #[kretprobe]
        pub fn $kretprobe(ctx: RetProbeContext) -> u32 {
            let n = slot!($n);
            if let Some(st) = cpu_state(&ctx) {
                let env = Kernel {
                    st,
                    preemptible: false,
                    patched: false,
                    plain: false,
                };
                pair_exit(&env, n, Key::kretprobe(&ctx), false);
            } else {
                no_state(n, true);
            }
            0
        }
        #[btf_tracepoint]
        pub fn $tp(ctx: BtfTracePointContext) -> i32 {
            on_hit(&ctx, slot!($n)) as i32
        }
    };
}

probe_slot!(
    0,
    fentry_0,
    fexit_0,
    fentry_patched_0,
    fexit_patched_0,
    fentry_lean_0,
    fexit_lean_0,
    kprobe_0,
    kretprobe_0,
    tp_0
);

probe_slot!(
    1,
    fentry_1,
    fexit_1,
    fentry_patched_1,
    fexit_patched_1,
    fentry_lean_1,
    fexit_lean_1,
    kprobe_1,
    kretprobe_1,
    tp_1
);

probe_slot!(
    2,
    fentry_2,
    fexit_2,
    fentry_patched_2,
    fexit_patched_2,
    fentry_lean_2,
    fexit_lean_2,
    kprobe_2,
    kretprobe_2,
    tp_2
);

probe_slot!(
    3,
    fentry_3,
    fexit_3,
    fentry_patched_3,
    fexit_patched_3,
    fentry_lean_3,
    fexit_lean_3,
    kprobe_3,
    kretprobe_3,
    tp_3
);

probe_slot!(
    4,
    fentry_4,
    fexit_4,
    fentry_patched_4,
    fexit_patched_4,
    fentry_lean_4,
    fexit_lean_4,
    kprobe_4,
    kretprobe_4,
    tp_4
);

probe_slot!(
    5,
    fentry_5,
    fexit_5,
    fentry_patched_5,
    fexit_patched_5,
    fentry_lean_5,
    fexit_lean_5,
    kprobe_5,
    kretprobe_5,
    tp_5
);

probe_slot!(
    6,
    fentry_6,
    fexit_6,
    fentry_patched_6,
    fexit_patched_6,
    fentry_lean_6,
    fexit_lean_6,
    kprobe_6,
    kretprobe_6,
    tp_6
);

probe_slot!(
    7,
    fentry_7,
    fexit_7,
    fentry_patched_7,
    fexit_patched_7,
    fentry_lean_7,
    fexit_lean_7,
    kprobe_7,
    kretprobe_7,
    tp_7
);

probe_slot!(
    8,
    fentry_8,
    fexit_8,
    fentry_patched_8,
    fexit_patched_8,
    fentry_lean_8,
    fexit_lean_8,
    kprobe_8,
    kretprobe_8,
    tp_8
);

probe_slot!(
    9,
    fentry_9,
    fexit_9,
    fentry_patched_9,
    fexit_patched_9,
    fentry_lean_9,
    fexit_lean_9,
    kprobe_9,
    kretprobe_9,
    tp_9
);

probe_slot!(
    10,
    fentry_10,
    fexit_10,
    fentry_patched_10,
    fexit_patched_10,
    fentry_lean_10,
    fexit_lean_10,
    kprobe_10,
    kretprobe_10,
    tp_10
);

probe_slot!(
    11,
    fentry_11,
    fexit_11,
    fentry_patched_11,
    fexit_patched_11,
    fentry_lean_11,
    fexit_lean_11,
    kprobe_11,
    kretprobe_11,
    tp_11
);

// Floors for `cargo xtask bench`, attached next to the real programs on the same function:
// (a) empty programs of the same type; (b) the least any latency tracer must do, a clock read
// at entry into a per-CPU slot and a clock read at exit added to a per-CPU sum.

/// Floor (b): [start, sum] per CPU.
#[map]
pub(crate) static FLOOR: PerCpuArray<[u64; 2]> = PerCpuArray::with_max_entries(1, 0);

#[inline(always)]
pub(crate) fn floor_entry() -> u32 {
    if let Some(p) = FLOOR.get_ptr_mut(0) {
        // SAFETY: pointer from a successful map lookup.
        unsafe { (*p)[0] = bpf_ktime_get_ns() };
    }
    0
}

#[inline(always)]
pub(crate) fn floor_exit() -> u32 {
    // SAFETY: helper without preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    if let Some(p) = FLOOR.get_ptr_mut(0) {
        // SAFETY: pointer from a successful map lookup.
        unsafe { (*p)[1] += now.wrapping_sub((*p)[0]) };
    }
    0
}

/// Floor programs of one entry/exit program type: (a) empty, (b) clock at entry and exit. The
/// names are those of `memcg_trace_common::names::FLOOR_*`.
macro_rules! floor_pair {
    ($entry:ident, $exit:ident, $entry_ctx:ty, $exit_ctx:ty,
     $empty_entry:ident, $empty_exit:ident, $clock_entry:ident, $clock_exit:ident) => {
        #[$entry]
        pub fn $empty_entry(_ctx: $entry_ctx) -> u32 {
            0
        }
        #[$exit]
        pub fn $empty_exit(_ctx: $exit_ctx) -> u32 {
            0
        }
        #[$entry]
        pub fn $clock_entry(_ctx: $entry_ctx) -> u32 {
            floor_entry()
        }
        #[$exit]
        pub fn $clock_exit(_ctx: $exit_ctx) -> u32 {
            floor_exit()
        }
    };
}

floor_pair!(
    fentry,
    fexit,
    FEntryContext,
    FExitContext,
    floor_empty_fentry,
    floor_empty_fexit,
    floor_clock_fentry,
    floor_clock_fexit
);

floor_pair!(
    kprobe,
    kretprobe,
    ProbeContext,
    RetProbeContext,
    floor_empty_kprobe,
    floor_empty_kretprobe,
    floor_clock_kprobe,
    floor_clock_kretprobe
);

#[btf_tracepoint]
pub fn floor_empty_tp(_ctx: BtfTracePointContext) -> i32 {
    0
}

/// Tracepoint floor (b): the least a counting tracer does, one per-CPU increment.
#[btf_tracepoint]
pub fn floor_clock_tp(_ctx: BtfTracePointContext) -> i32 {
    if let Some(p) = FLOOR.get_ptr_mut(0) {
        // SAFETY: pointer from a successful map lookup.
        unsafe { (*p)[1] += 1 };
    }
    0
}

/// The switch witness's counts, one per CPU (see `memcg_trace_common::HeldSwitches`); sized by
/// userspace at load, which reads it through a memory mapping.
#[map]
pub(crate) static HELD_SWITCHES: Array<HeldSwitches> = Array::with_max_entries(1, BPF_F_MMAPABLE);

/// The switch witness, on `sched_switch`: counts the switches that find this CPU's
/// `bpf_prog_active` held (see `memcg_trace_common::HeldSwitches` for why that proves the
/// deferred pairs of a kprobe). Not a raw tracepoint's recursion guard nor the count itself
/// stops it: it runs on every switch. A count it cannot read counts as held.
#[btf_tracepoint]
pub fn held_switch(ctx: BtfTracePointContext) -> i32 {
    // SAFETY: helper without preconditions.
    let cpu = unsafe { bpf_get_smp_processor_id() };
    let Some(h) = HELD_SWITCHES.get_ptr_mut(cpu) else {
        // (The array has an element per possible CPU: not reached.) Counted as held, in the
        // first element, shared: atomically.
        if let Some(h) = HELD_SWITCHES.get_ptr_mut(0) {
            // SAFETY: an aligned u64 in a map value.
            unsafe {
                atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(
                    core::ptr::addr_of_mut!((*h).held),
                    1,
                )
            };
        }
        return 0;
    };
    let l = layout();
    let held = match cpu_state(&ctx) {
        // `find_cpu_base` stored the per-CPU base plus `preempt_count` (on arm64 a task
        // offset, which makes no address; the base comes back all the same).
        Some(st) if l.prog_active != 0 => {
            let at = st
                .preempt_addr()
                .wrapping_sub(l.preempt_count)
                .wrapping_add(l.prog_active);
            // SAFETY: a read of kernel memory through the fault-safe helper.
            unsafe { bpf_probe_read_kernel(at as *const i32) }.map_or(true, |n| n != 0)
        }
        _ => true,
    };
    // SAFETY: pointer from a successful map lookup; only this CPU's switches, which do not
    // nest, write this element.
    unsafe {
        (*h).seen += 1;
        if held {
            (*h).held += 1;
        }
    }
    0
}

// Context checks for the mask calibration and `memcg-trace selftest`: programs on tracepoints
// whose context is known (memcg_trace_common::CTX_SOURCES) count how the shared classification
// sees them, in CTX_CHECK[ctx_check_index(row, got)], and collect the raw preempt_count bits.

#[map]
pub(crate) static CTX_CHECK: PerCpuArray<u64> =
    PerCpuArray::with_max_entries(CTX_CHECK_ROWS * CTX_CHECK_COLS, 0);

/// Raw preempt_count bits seen per row: (any, all) pairs; "all" carries bit 40 once set.
#[map]
pub(crate) static CTX_BITS: PerCpuArray<u64> = PerCpuArray::with_max_entries(CTX_CHECK_ROWS * 2, 0);

#[inline(always)]
pub(crate) fn ctx_check<C: EbpfContext>(c: &C, row: u32) -> i32 {
    let Some(st) = cpu_state(c) else {
        if let Some(n) = CTX_CHECK.get_ptr_mut(ctx_check_index(row, CTX_UNKNOWN)) {
            // SAFETY: pointer from a successful map lookup.
            unsafe { *n += 1 };
        }
        return 0;
    };
    if let Some(pc) = context_count(st, false) {
        let pc = (pc & 0x7fff_ffff) as u64;
        if let Some(o) = CTX_BITS.get_ptr_mut(row * 2) {
            // SAFETY: pointer from a successful map lookup.
            unsafe { *o |= pc };
        }
        if let Some(a) = CTX_BITS.get_ptr_mut(row * 2 + 1) {
            // SAFETY: pointer from a successful map lookup; 0 marks "no sample yet".
            unsafe {
                *a = if *a == 0 {
                    pc | (1 << 40)
                } else {
                    *a & (pc | (1 << 40))
                }
            };
        }
    }
    let got = read_context(st, false).unwrap_or(CTX_UNKNOWN);
    if let Some(n) = CTX_CHECK.get_ptr_mut(ctx_check_index(row, got)) {
        // SAFETY: pointer from a successful map lookup.
        unsafe { *n += 1 };
    }
    0
}

macro_rules! ctx_check_row {
    ($row:expr, $name:ident) => {
        #[btf_tracepoint]
        pub fn $name(ctx: BtfTracePointContext) -> i32 {
            ctx_check(&ctx, $row)
        }
    };
}

ctx_check_row!(0, ctx_check_0);

ctx_check_row!(1, ctx_check_1);

ctx_check_row!(2, ctx_check_2);

ctx_check_row!(3, ctx_check_3);

ctx_check_row!(4, ctx_check_4);

ctx_check_row!(5, ctx_check_5);

ctx_check_row!(6, ctx_check_6);

/// BPF iterator over the kernel's programs (`iter/bpf_prog`): writes, per program, its id and
/// the per-CPU address of its stats, so that userspace can point PROG_MISSES at the fentry
/// programs' own recursion counters.
#[no_mangle]
#[link_section = "iter/bpf_prog"]
pub fn prog_stats(ctx: *mut c_void) -> i32 {
    let l = layout();
    // SAFETY: ctx is struct bpf_iter__bpf_prog { meta; prog; }. bpf_seq_write needs the
    // verifier's typed seq_file pointer, so meta and meta->seq are loaded directly; the
    // program's fields are read as plain numbers through the fault-safe helper.
    unsafe {
        let meta = core::ptr::read_volatile(ctx as *const *const u64);
        let Ok(prog) = bpf_probe_read_kernel((ctx as *const u64).add(1)) else {
            return 0;
        };
        if prog == 0 || meta.is_null() {
            return 0;
        }
        let seq = core::ptr::read_volatile(meta);
        let Ok(aux) = bpf_probe_read_kernel((prog + l.prog_aux) as *const u64) else {
            return 0;
        };
        let Ok(id) = bpf_probe_read_kernel((aux + l.prog_aux_id) as *const u32) else {
            return 0;
        };
        let Ok(stats) = bpf_probe_read_kernel((prog + l.prog_stats) as *const u64) else {
            return 0;
        };
        let rec = [id as u64, stats];
        bpf_seq_write(
            seq as *mut _,
            rec.as_ptr() as *const c_void,
            core::mem::size_of_val(&rec) as u32,
        );
    }
    0
}
