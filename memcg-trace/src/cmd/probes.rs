//! `memcg-trace probes`: what each probe resolves to on this kernel, which backend attaches it,
//! and why the others did not.

use anyhow::Result;

use crate::{
    kernel,
    session::{self, ProbeSel},
};

/// `memcg-trace probes`.
pub fn run(sel: ProbeSel) -> Result<i32> {
    let sel = ProbeSel {
        all: sel.all || (sel.probe.is_empty() && sel.func.is_empty()),
        ..sel
    };
    let tracer = session::attach(&sel, session::AttachOptions::quiet())?.tracer;
    println!("kernel {}", kernel::release());
    for a in &tracer.attached {
        println!(
            "{:<16} {:<28} {:<10} attached",
            a.name,
            a.target,
            a.backend.to_string()
        );
        for n in &a.notes {
            println!("{:<16}   {n}", "");
        }
    }

    for f in &tracer.failed {
        println!("{:<16} {:<28} {:<10} not attached", f.name, "-", "-");
        for n in &f.reasons {
            println!("{:<16}   {n}", "");
        }
    }
    Ok(0)
}
