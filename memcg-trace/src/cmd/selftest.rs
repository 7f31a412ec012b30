//! `memcg-trace selftest` (hidden): the in-kernel bucketing and context code checked on fixed
//! inputs (BPF_PROG_TEST_RUN) and on tracepoints whose context is known.

use std::time::Duration;

use anyhow::Result;
use memcg_trace_common::{bucket_index, CTX_NAMES};

use crate::{calibrate, kernel, session::check_privileges, tracer};

/// `memcg-trace selftest`: the kernel-side bucketing must agree with [`bucket_index`] for every
/// value, and a program run from a syscall must see task context.
pub fn run() -> Result<i32> {
    check_privileges()?;
    let btf = kernel::open_btf()?;
    let (layout, masks) = calibrate::masks(kernel::layout(&btf)?);
    drop(btf);
    println!(
        "selftest: masks nmi {:#x} hardirq {:#x} softirq {:#x} ({})",
        masks.nmi_mask, masks.hardirq_mask, masks.softirq_offset, masks.source
    );
    let values = [
        0u64,
        1,
        31,
        32,
        33,
        63,
        64,
        100,
        1000,
        1500,
        4095,
        4096,
        123_456,
        10_000_000,
        1 << 35,
        (1 << 36) + 5,
        u64::MAX >> 1,
    ];
    let results = tracer::selftest(&layout, &values)?;
    let mut bad = 0;
    for (v, got, ctx) in &results {
        let want = bucket_index(*v);
        let ctx_name = usize::try_from(*ctx)
            .ok()
            .and_then(|c| CTX_NAMES.get(c))
            .copied()
            .unwrap_or("unknown");
        let ok = *got == Some(want) && ctx_name == "task";
        if !ok {
            bad += 1;
        }
        println!(
            "selftest: ns={v} bucket kernel={got:?} userspace={want} context={ctx_name} {}",
            if ok { "ok" } else { "MISMATCH" }
        );
    }
    println!("selftest: {} values, {bad} mismatches", results.len());
    // Live: tracepoints of known context, classified by the same code the probes use.
    for c in tracer::context_check(&layout, Duration::from_secs(1), false)? {
        let col = CTX_NAMES.iter().position(|n| *n == c.expected).unwrap_or(4);
        let right = c.counts[col];
        let total: u64 = c.counts.iter().sum();
        let wrong = total - right;
        if right == 0 || wrong > 0 {
            bad += 1;
        }
        println!(
            "selftest: {} ({}): {total} hits, {right} classified {}, {wrong} otherwise {:?}, preempt_count bits any {:#x} all {:#x} {}",
            c.tracepoint,
            c.expected,
            c.expected,
            c.counts,
            c.bits_any,
            c.bits_all,
            if right > 0 && wrong == 0 { "ok" } else { "MISMATCH" }
        );
    }
    println!("selftest: {bad} failures");
    Ok(if bad == 0 { 0 } else { 1 })
}
