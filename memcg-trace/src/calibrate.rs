//! What is measured on the running kernel at start-up rather than assumed: the preempt_count
//! layout behind the context split.

use std::time::Duration;

use memcg_trace_common::KernelLayout;

use crate::{kernel, tracer};

/// The preempt_count masks of this kernel, read from preempt_count in contexts known from
/// tracepoints (timer interrupt, softirq entry); the classic layout if that saw too little.
/// Kernels disagree: Debian 7.3 counts hardirqs from bit 24, earlier ones from bit 16.
pub fn masks(mut layout: KernelLayout) -> (KernelLayout, kernel::ContextMasks) {
    let masks = match tracer::context_check(&layout, Duration::from_secs(1), true) {
        Ok(check) => {
            let all = |ctx: &str| {
                check
                    .iter()
                    .find(|c| c.expected == ctx)
                    .map(|c| c.bits_all as u32)
                    .unwrap_or(0)
            };
            kernel::derive_masks(all("softirq"), all("hardirq")).unwrap_or_else(|| {
                kernel::ContextMasks::classic(
                    "default (calibration saw no softirq or timer interrupt)",
                )
            })
        }
        Err(e) => kernel::ContextMasks::classic(&format!("default (calibration failed: {e:#})")),
    };
    layout.nmi_mask = masks.nmi_mask;
    layout.hardirq_mask = masks.hardirq_mask;
    layout.softirq_offset = masks.softirq_offset;
    (layout, masks)
}
