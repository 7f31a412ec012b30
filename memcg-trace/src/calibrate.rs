//! What is measured on the running kernel at start-up rather than assumed: the preempt_count
//! layout behind the context split, and the instrumentation floor of each backend in use.

use std::time::Duration;

use memcg_trace_common::{CtxUse, KernelLayout, CTX_HARDIRQ, CTX_NMI, CTX_SOFTIRQ};

use crate::{
    kernel,
    tracer::checks::{self, ContextCheck},
};

/// The preempt_count masks of this kernel, read from preempt_count in contexts known from
/// tracepoints (timer interrupt, softirq entry, and an NMI where the PMU can raise one). When
/// that sees too little, the classic layout is used and `source` says why: callers show it and
/// `--strict` refuses to go on. Kernels disagree: Debian 7.3 counts hardirqs from bit 24,
/// earlier ones from bit 16.
pub fn masks(found: kernel::Layout) -> (KernelLayout, kernel::ContextMasks) {
    let mut layout = found.offsets;
    if let Some(why) = found.no_context_split {
        // Nothing to calibrate: the preempt count cannot be read (see `kernel::layout`).
        let mut no_split = kernel::ContextMasks::classic(&format!(
            "none: no context split, every call is counted under context \"all\" (interrupt-context calls made while a workload task runs count as the workload's): {why}"
        ));
        (
            no_split.nmi_mask,
            no_split.hardirq_mask,
            no_split.softirq_offset,
        ) = (0, 0, 0);
        no_split.nmi = "none".into();
        no_split.percpu = "none".into();
        layout.set_context_masks(0, 0, 0);
        no_split.threads = layout.task_comm != 0;
        return (layout, no_split);
    }

    let check = checks::context_check(
        &layout,
        &[CtxUse::Calibration],
        Duration::from_secs(1),
        true,
        || {
            checks::raise_nmis(Duration::from_millis(50));
        },
    );
    let mut masks = match check {
        Ok(rows) => {
            // Bits set in every hit of the rows of one context (0 when none was seen).
            let all = |ctx: u32| -> u32 {
                rows.iter()
                    .filter(|r| r.expected == memcg_trace_common::CTX_NAMES[ctx as usize])
                    .filter(|r| r.hits() > 0)
                    .map(|r: &ContextCheck| r.bits_all as u32)
                    .fold(0, |a, b| if a == 0 { b } else { a & b })
            };
            kernel::derive_masks(all(CTX_SOFTIRQ), all(CTX_HARDIRQ), all(CTX_NMI)).unwrap_or_else(
                || {
                    kernel::ContextMasks::classic(
                        "default: calibration saw no softirq or no timer interrupt",
                    )
                },
            )
        }
        Err(e) => kernel::ContextMasks::classic(&format!("default: calibration failed: {e:#}")),
    };
    if layout.percpu_from_kallsyms != 0 {
        masks.percpu = "kallsyms".into();
    }

    if layout.task_softirq != 0 {
        masks.softirq = "task".into();
    }

    masks.threads = layout.task_comm != 0;
    layout.set_context_masks(masks.nmi_mask, masks.hardirq_mask, masks.softirq_offset);
    (layout, masks)
}
