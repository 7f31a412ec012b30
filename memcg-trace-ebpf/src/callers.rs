//! Where a call came from: its call site (fentry and kprobe), the sampled short stacks, the
//! per-site and per-memcg counts.

use crate::*;

/// Counts a call in `map` under `key` (timed: with its latency `ns`); false when the key finds
/// no room (the map is full, or its insertion lost a race): the caller counts it as "other".
#[inline(always)]
pub(crate) fn count_under<K>(map: &HashMap<K, CallerStat>, key: &K, ns: u64, timed: bool) -> bool {
    let mut v = map.get_ptr_mut(key);
    if v.is_none() {
        if let Some(zero) = CALLER_ZERO.get(0) {
            // BPF_NOEXIST: a key inserted meanwhile by another CPU is kept, and found below.
            let _ = map.insert(key, zero, 1);
            v = map.get_ptr_mut(key);
        }
    }
    let Some(v) = v else {
        return false;
    };
    // SAFETY: pointer from a successful map lookup; shared by every CPU, so every update is
    // atomic.
    count_in(unsafe { &mut *v }, ns, timed);
    true
}

/// Counts a call of id `id` in its slot of `front` (see `FrontSlot`), claiming the slot if it
/// is free; false when another id holds it (or the legacy object, without compare-and-swap):
/// the caller counts the call in the map behind.
#[inline(always)]
pub(crate) fn count_in_front(
    front: &Array<FrontSlot>,
    probe: u32,
    ctx: u32,
    cpu: u32,
    id: u64,
    ns: u64,
    timed: bool,
) -> bool {
    // id + 1 is the tag: an id of all ones (no call site or memcg has it) goes to the map; a
    // context beyond the four would index the next probe's region.
    if LEGACY || id == u64::MAX || ctx >= NUM_CTX as u32 {
        return false;
    }
    let shards = config().shard_mask + 1;
    let index = front_index(probe, ctx, shard(cpu) as u32, shards, id);
    let Some(slot) = front.get_ptr_mut(index) else {
        return false;
    };
    // SAFETY: pointer from a successful lookup of an array map.
    let slot = unsafe { &mut *slot };
    let want = id + 1;
    // SAFETY: an aligned u64 in a map value, written by other runs (compare-and-swap below).
    let tag = unsafe { core::ptr::read_volatile(&slot.tag) };
    if tag != want {
        if tag != 0 {
            return false;
        }
        // SAFETY: as above. A run that claimed the slot meanwhile for the same id is as good.
        let (now, _) = unsafe {
            atomic_cxchg::<u64, { AtomicOrdering::Relaxed }, { AtomicOrdering::Relaxed }>(
                &mut slot.tag,
                0,
                want,
            )
        };
        if now != 0 && now != want {
            return false;
        }
    }
    count_in(&mut slot.stat, ns, timed);
    true
}

/// Adds a call (timed: with its latency `ns`) to `v`, atomically (the entries and slots are
/// shared by the CPUs of a shard, and runs interleave on preemptible kernels).
#[inline(always)]
fn count_in(v: &mut CallerStat, ns: u64, timed: bool) {
    add(&mut v.count, 1, true);
    if timed {
        add(&mut v.sum_ns, ns, true);
        // As `bucket_of`: the table's index masked where the verifier sees it.
        let i = if ns < SHORT_NS {
            // SAFETY: the index is below SHORT_NS, the table's length.
            (unsafe { *SHORT_CALLER_BUCKETS.get_unchecked(short_index(ns)) }) as usize
        } else {
            caller_bucket_by_log(ns)
        } & (CALLER_BUCKETS - 1);
        add(&mut v.buckets[i], 1, true);
    }
}

/// The shard of the breakdown maps CPU `cpu` counts in (see `BREAKDOWN_SHARDS`).
#[inline(always)]
fn shard(cpu: u32) -> u16 {
    (cpu & config().shard_mask) as u16
}

/// Counts a timed call on CPU `cpu` under its call site (`--callers`); one that finds no room
/// goes to the "other" counter.
#[inline(always)]
pub(crate) fn count_caller(
    cs: &mut Counters,
    cpu: u32,
    probe: u32,
    ctx: u32,
    caller: u64,
    ns: u64,
) {
    if count_in_front(&CALLER_FRONT, probe, ctx, cpu, caller, ns, true) {
        return;
    }
    let key = CallerKey {
        caller,
        probe,
        ctx: ctx as u16,
        shard: shard(cpu),
    };
    if !count_under(&CALLERS, &key, ns, true) {
        add(&mut cs.callers_other, 1, true);
    }
}

/// Counts a call on CPU `cpu` under the memcg it charges (`--by-memcg`; timed: with its
/// latency); one that finds no room goes to the "other" counter.
#[inline(always)]
pub(crate) fn count_memcg(
    cs: &mut Counters,
    cpu: u32,
    probe: u32,
    ctx: u32,
    memcg: u64,
    ns: u64,
    timed: bool,
) {
    if count_in_front(&MEMCG_FRONT, probe, ctx, cpu, memcg, ns, timed) {
        return;
    }
    let key = MemcgKey {
        memcg,
        probe,
        ctx: ctx as u16,
        shard: shard(cpu),
    };
    if !count_under(&MEMCGS, &key, ns, timed) {
        add(&mut cs.memcgs_other, 1, true);
    }
}

/// fentry: the call site, from the trampoline's frame. The trampoline saves the traced
/// function's argument registers at the program's context, `nr` words (the count is in the word
/// before them), then, if an exit program is attached, a word for the return value, then its
/// frame pointer, then its return address: into the traced function just past its patched
/// first instruction when the function *calls* the trampoline (and above it the return address
/// into the caller), or, from 7.x on where the function *jumps* to it (an exit program
/// attached, `DYNAMIC_FTRACE_WITH_JMP`), straight into the caller. Each layout is recognised
/// by what it holds: a return address a few bytes into the traced function, or one right after
/// a call of it. When neither checks, the site is unknown (0), never a guess.
#[inline(always)]
pub(crate) fn fentry_caller(ctx: &FEntryContext) -> u64 {
    // The frame read below is x86's trampoline's (arm64's keeps the caller's return address
    // elsewhere): unknown there.
    if layout().arch == ARCH_ARM64 {
        return 0;
    }
    // SAFETY: helpers the verifier inlines into loads from the trampoline's frame.
    let (nr, ip) = unsafe {
        (
            bpf_get_func_arg_cnt(ctx.as_ptr()) as usize,
            bpf_get_func_ip(ctx.as_ptr()),
        )
    };
    if nr > 12 {
        return 0;
    }
    if layout().direct_reads != 0 {
        // The three words wanted, each a plain fault-safe load (see `kernel_u64`).
        let frame = ctx.as_ptr() as u64;
        return site_in_frame(|i| kernel_u64(frame + 8 * i as u64), nr, ip);
    }
    // Without the cast: the frame's first 16 words in one helper call, not three.
    // SAFETY: a fault-safe read of the trampoline's stack frame.
    let Ok(words) = (unsafe { bpf_probe_read_kernel(ctx.as_ptr() as *const [u64; 16]) }) else {
        return 0;
    };
    site_in_frame(|i| words.get(i).copied().unwrap_or(0), nr, ip)
}

/// The call site in the trampoline's frame (see `fentry_caller`), whose word `i` is `at(i)`,
/// for a traced function at `ip` with `nr` argument words.
#[inline(always)]
fn site_in_frame(at: impl Fn(usize) -> u64, nr: usize, ip: u64) -> u64 {
    let into_fn = |a: u64| a.wrapping_sub(ip).wrapping_sub(1) < 16;
    if into_fn(at(nr + 1)) {
        return at(nr + 2);
    }
    let above = at(nr + 2);
    if into_fn(above) {
        return at(nr + 3);
    }
    if calls_fn(above, ip) {
        above
    } else {
        0
    }
}

/// Whether the instruction before return address `ret` is a direct call (`e8 rel32`) of the
/// function at `ip` (or of its call-depth thunk or endbr just before it).
#[inline(always)]
pub(crate) fn calls_fn(ret: u64, ip: u64) -> bool {
    if ret < 8 {
        return false;
    }
    // A fault reads 0, which is no call.
    let code = kernel_u64(ret - 8);
    let op = (code >> 24) as u8;
    let rel = (code >> 32) as u32 as i32 as i64 as u64;
    let target = ret.wrapping_add(rel);
    op == 0xe8 && ip.wrapping_sub(target).wrapping_add(16) < 48
}

/// With `--callers-depth`, one entry in `stack_sample` on this CPU: unwinds the kernel stack
/// (the kernel's own unwinder, `STACK_UNWIND` frames at most), finds the call site `caller` in
/// it and counts the short stack from there (`StackKey`) under `probe` and `ctx`. A site not
/// found (an unwinder that cannot get through the trampoline or the probe) is counted with
/// `STACK_UNWOUND` above it, so that every sampled entry with a site is counted once.
#[inline(always)]
pub(crate) fn sample_stack<C: EbpfContext>(c: &C, st: St, probe: u32, ctx: u32, caller: u64) {
    let cfg = config();
    if cfg.stack_depth == 0 || caller == 0 {
        return;
    }
    // SAFETY: this CPU's state, written only through its pointer.
    unsafe {
        let n = core::ptr::addr_of_mut!((*st.0).since_stack);
        let k = core::ptr::read(n) + 1;
        if k < cfg.stack_sample {
            core::ptr::write(n, k);
            return;
        }
        core::ptr::write(n, 0);
    }
    let mut buf = [0u64; STACK_UNWIND];
    // SAFETY: the helper writes at most the buffer's size.
    let got = unsafe {
        bpf_get_stack(
            c.as_ptr(),
            buf.as_mut_ptr() as *mut c_void,
            core::mem::size_of_val(&buf) as u32,
            0,
        )
    };
    let mut key = StackKey {
        frames: [0; STACK_DEPTH],
        probe,
        ctx,
    };
    key.frames[0] = caller;
    key.frames[1] = STACK_UNWOUND;
    let n = if got > 0 { got as usize / 8 } else { 0 };
    for i in 0..STACK_UNWIND {
        if i >= n {
            break;
        }
        if buf[i] == caller {
            for j in 1..STACK_DEPTH {
                key.frames[j] = if (j as u32) < cfg.stack_depth {
                    buf.get(i + j).copied().unwrap_or(0)
                } else {
                    0
                };
            }
            break;
        }
    }
    match STACKS.get_ptr_mut(&key) {
        // SAFETY: pointer from a successful map lookup; shared by every CPU.
        Some(v) => add(unsafe { &mut *v }, 1, true),
        None => {
            // BPF_NOEXIST: one inserted meanwhile by another CPU is counted below.
            if STACKS.insert(&key, &1, 1).is_err() {
                if let Some(v) = STACKS.get_ptr_mut(&key) {
                    // SAFETY: as above.
                    add(unsafe { &mut *v }, 1, true);
                }
            }
        }
    }
}

/// kprobe at a function's entry: on x86 the stack pointer points at the return address into
/// the caller; on arm64 the link register holds it.
#[inline(always)]
pub(crate) fn kprobe_caller(ctx: &ProbeContext) -> u64 {
    let regs = ctx.regs as *const c_void;
    if layout().arch == ARCH_ARM64 {
        return reg_word::<ARM64_LR>(regs);
    }
    kernel_u64(reg_sp(regs))
}

/// Offsets in `struct pt_regs`, the kprobe programs' context: x86_64 (`sp`, `di`: the first
/// argument) and arm64 (`sp`, `regs[0]`: the first argument, `regs[30]`: the link register).
pub(crate) const X86_SP: u16 = 19 * 8;

pub(crate) const X86_DI: u16 = 14 * 8;

pub(crate) const ARM64_SP: u16 = 31 * 8;

pub(crate) const ARM64_X0: u16 = 0;

pub(crate) const ARM64_LR: u16 = 30 * 8;

/// The word at offset `OFF` of the kprobe context `regs`: a load with the offset in the
/// instruction, as the verifier requires of context reads. In assembly, so that the two
/// architectures' loads (one of which the verifier drops, see `KernelLayout::arch`) stay two
/// loads: merged into one with a computed offset, the verifier would refuse both.
#[inline(always)]
pub(crate) fn reg_word<const OFF: u16>(regs: *const c_void) -> u64 {
    let v: u64;
    // SAFETY: a load from the program's context at a constant offset inside `pt_regs`.
    unsafe {
        core::arch::asm!("{0} = *(u64 *)({1} + {off})", out(reg) v, in(reg) regs,
            off = const OFF, options(readonly, nostack, preserves_flags));
    }
    v
}

/// The stack pointer in a kprobe's registers.
#[inline(always)]
pub(crate) fn reg_sp(regs: *const c_void) -> u64 {
    if layout().arch == ARCH_ARM64 {
        reg_word::<ARM64_SP>(regs)
    } else {
        reg_word::<X86_SP>(regs)
    }
}

/// The first argument in a kprobe's registers (at the function's entry).
#[inline(always)]
pub(crate) fn reg_arg0(regs: *const c_void) -> u64 {
    if layout().arch == ARCH_ARM64 {
        reg_word::<ARM64_X0>(regs)
    } else {
        reg_word::<X86_DI>(regs)
    }
}
