//! Call sites (`--callers`): who calls each traced function, and what those calls cost. The
//! programs count every timed call under the return address into its caller (`CALLERS`, see
//! `memcg_trace_common::CallerKey`); the calls userspace confirms (deferred pairs) are added
//! here. Addresses are named once each, from the running kernel's symbols (`function+offset`,
//! module symbols too).

use std::collections::HashMap;

use memcg_trace_common::{caller_bucket_bounds, caller_bucket_index, CALLER_BUCKETS};

/// The timed calls of one call site of one probe in one context.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Site {
    /// Context (`CTX_*`).
    pub ctx: u32,
    /// Return address into the calling function (0: it could not be read).
    pub addr: u64,
    /// Its name (`function+0xoff`), once resolved.
    pub name: String,
    /// Calls.
    pub count: u64,
    /// Sum of their latencies, ns.
    pub sum_ns: u64,
    /// Calls per bucket (`caller_bucket_index`; quarter octaves).
    pub buckets: Vec<u64>,
}

impl Site {
    /// An empty site.
    pub fn new(ctx: u32, addr: u64) -> Self {
        Site {
            ctx,
            addr,
            name: String::new(),
            count: 0,
            sum_ns: 0,
            buckets: vec![0; CALLER_BUCKETS],
        }
    }

    /// Adds one call.
    pub fn add(&mut self, ns: u64) {
        self.count += 1;
        self.sum_ns += ns;
        self.buckets[caller_bucket_index(ns).min(CALLER_BUCKETS - 1)] += 1;
    }

    /// Adds another site's calls (same site).
    pub fn merge(&mut self, o: &Site) {
        self.count += o.count;
        self.sum_ns += o.sum_ns;
        for (a, b) in self.buckets.iter_mut().zip(&o.buckets) {
            *a += b;
        }
    }

    /// The latency at quantile `q` (0..=1), interpolated linearly inside its bucket; None
    /// without calls.
    pub fn quantile(&self, q: f64) -> Option<u64> {
        let total: u64 = self.buckets.iter().sum();
        if total == 0 {
            return None;
        }

        let rank = (q.clamp(0.0, 1.0) * total as f64).max(1.0);
        let mut below = 0u64;
        for (i, &n) in self.buckets.iter().enumerate() {
            if n == 0 {
                continue;
            }

            if (below + n) as f64 >= rank {
                let (lo, hi) = caller_bucket_bounds(i);
                let f = (rank - below as f64) / n as f64;
                return Some(lo + ((hi.saturating_sub(lo)) as f64 * f) as u64);
            }
            below += n;
        }
        None
    }
}

/// A sampled short stack of one probe in one context (`--callers-depth`): the call site, then
/// the return addresses above it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stack {
    /// Context (`CTX_*`).
    pub ctx: u32,
    /// Return addresses, innermost first (`memcg_trace_common::STACK_UNWOUND` second when the
    /// stack above the site could not be unwound).
    pub frames: Vec<u64>,
    /// Their names (`function+0xoff`; `(not unwound)`).
    pub names: Vec<String>,
    /// Sampled entries that had this stack.
    pub count: u64,
}

/// A short stack as the programs unwound it, (address, name) innermost first, without the
/// tracer's own frames: BPF code (`[bpf]`: a traced caller's fentry trampoline), and, right
/// above such a trampoline, the return address of the patched call at the start of the
/// function below it (the caller's own function again, a few bytes in), which the
/// trampoline skips when it returns.
pub fn strip_tracer_frames(raw: Vec<(u64, String)>) -> Vec<(u64, String)> {
    let func = |n: &str| n.split('+').next().unwrap_or("").to_string();
    let offset = |n: &str| {
        n.split('+')
            .nth(1)
            .and_then(|o| o.split_whitespace().next())
            .and_then(|o| u64::from_str_radix(o.trim_start_matches("0x"), 16).ok())
    };
    let mut out: Vec<(u64, String)> = Vec::with_capacity(raw.len());
    let mut after_bpf = false;
    for (a, n) in raw {
        // The site itself always stays: it is where the call came from, BPF code or not.
        let bpf =
            n.ends_with("[bpf]") || n.starts_with("bpf_trampoline_") || n.starts_with("bpf_prog_");
        if bpf && !out.is_empty() {
            after_bpf = true;
            continue;
        }

        let patched_call = after_bpf
            && offset(&n).is_some_and(|o| o < 0x20)
            && out.last().is_some_and(|(_, prev)| func(prev) == func(&n));
        after_bpf = false;
        if !patched_call {
            out.push((a, n));
        }
    }
    out
}

/// Confirmed deferred calls per (probe slot, context, call site).
#[derive(Debug, Default)]
pub struct Confirmed {
    sites: HashMap<(u32, u32, u64), Site>,
}

impl Confirmed {
    /// Adds one confirmed call.
    pub fn add(&mut self, probe: u32, ctx: u32, addr: u64, ns: u64) {
        self.sites
            .entry((probe, ctx, addr))
            .or_insert_with(|| Site::new(ctx, addr))
            .add(ns);
    }

    /// The sites of `probe`.
    pub fn of(&self, probe: u32) -> impl Iterator<Item = &Site> {
        self.sites
            .iter()
            .filter(move |((p, _, _), _)| *p == probe)
            .map(|(_, s)| s)
    }
}

/// Names of kernel text addresses, each looked up once, in a copy of the kernel's symbol
/// table taken at start-up: /proc/kallsyms shows addresses only to a reader with CAP_SYSLOG
/// (or none at all, by `kptr_restrict`), and the daemon gives its capabilities up once
/// attached.
#[derive(Debug, Default)]
pub struct Names {
    known: HashMap<u64, String>,
    /// The copy: a memfd, read by path (`/proc/self/fd/N`).
    copy: Option<std::os::fd::OwnedFd>,
}

impl Names {
    /// Takes the copy of the symbol table (call while privileged). Without one (no kallsyms,
    /// or addresses hidden), sites are shown as addresses: the error says why.
    pub fn new() -> (Self, Option<String>) {
        match kallsyms_copy() {
            Ok(fd) => (
                Names {
                    known: HashMap::new(),
                    copy: Some(fd),
                },
                None,
            ),
            Err(e) => (Names::default(), Some(format!("{e:#}"))),
        }
    }

    /// The name of `addr` (`function+0xoff [module]`), resolving every address of `addrs` not
    /// named yet in one pass over the kernel's symbols.
    pub fn resolve(&mut self, addrs: impl IntoIterator<Item = u64>) {
        let new: Vec<u64> = addrs
            .into_iter()
            .filter(|a| *a != 0 && !self.known.contains_key(a))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        if new.is_empty() {
            return;
        }

        let names = match &self.copy {
            Some(fd) => {
                use std::os::fd::AsRawFd as _;
                symbolize(&format!("/proc/self/fd/{}", fd.as_raw_fd()), &new)
            }
            None => new.iter().map(|a| format!("{a:#x}")).collect(),
        };
        for (a, n) in new.into_iter().zip(names) {
            self.known.insert(a, n);
        }
    }

    /// The name of an address resolved before (`unknown` for 0, the hex address if no symbol
    /// holds it).
    pub fn name(&self, addr: u64) -> String {
        if addr == 0 {
            return "unknown".into();
        }

        self.known
            .get(&addr)
            .cloned()
            .unwrap_or_else(|| format!("{addr:#x}"))
    }
}

/// A copy of /proc/kallsyms in a memfd, streamed (never all in memory at once); an error if
/// it shows no addresses.
fn kallsyms_copy() -> anyhow::Result<std::os::fd::OwnedFd> {
    use std::{
        io::{BufRead as _, Write as _},
        os::fd::FromRawFd as _,
    };

    // SAFETY: memfd_create with a NUL-terminated name; the fd is owned from here on.
    let fd = unsafe { libc::memfd_create(c"memcg-trace-kallsyms".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        anyhow::bail!("memfd_create: {}", std::io::Error::last_os_error());
    }

    // SAFETY: a fresh fd nobody else owns.
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    let src = std::fs::File::open("/proc/kallsyms")
        .map_err(|e| anyhow::anyhow!("/proc/kallsyms: {e}"))?;
    let mut out = std::io::BufWriter::new(std::fs::File::from(fd.try_clone()?));
    let mut shown = false;

    // Text symbols only: the call sites are code.
    for line in std::io::BufReader::new(src).lines() {
        let line = line?;
        let mut it = line.split_whitespace();
        let (Some(addr), Some(kind)) = (it.next(), it.next()) else {
            continue;
        };
        if matches!(kind, "t" | "T" | "w" | "W") {
            shown |= addr.bytes().any(|b| b != b'0');
            writeln!(out, "{line}")?;
        }
    }

    out.flush()?;
    if !shown {
        anyhow::bail!("/proc/kallsyms shows no addresses (kptr_restrict)");
    }
    Ok(fd)
}

/// `function+0xoff` (with ` [module]` for module text) for each address, from the kernel
/// symbol table at `kallsyms`; the hex address where no symbol holds it.
fn symbolize(kallsyms: &str, addrs: &[u64]) -> Vec<String> {
    use blazesym::symbolize::{
        source::{Kernel, Source},
        Input, Symbolized, Symbolizer,
    };
    let src = Source::Kernel(Kernel {
        kallsyms: blazesym::MaybeDefault::Some(kallsyms.into()),
        // kallsyms has every text symbol, modules' too; a vmlinux with debug information is
        // not on a stock system and would cost far more memory.
        vmlinux: blazesym::MaybeDefault::None,
        debug_syms: false,
        ..Default::default()
    });
    let fallback = || addrs.iter().map(|a| format!("{a:#x}")).collect();
    let symbolizer = Symbolizer::new();
    let Ok(syms) = symbolizer.symbolize(&src, Input::AbsAddr(addrs)) else {
        return fallback();
    };
    if syms.len() != addrs.len() {
        return fallback();
    }

    syms.into_iter()
        .zip(addrs)
        .map(|(s, a)| match s {
            Symbolized::Sym(sym) => {
                let module = sym
                    .module
                    .as_deref()
                    .map(|m| m.to_string_lossy().into_owned())
                    .filter(|m| !m.is_empty() && !m.contains("kallsyms"))
                    .map(|m| format!(" [{m}]"))
                    .unwrap_or_default();
                format!("{}+{:#x}{module}", sym.name, sym.offset)
            }
            Symbolized::Unknown(_) => format!("{a:#x}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_site_quantile_falls_in_the_bucket_of_that_rank() {
        let mut site = Site::new(0, 1);
        for ns in 1..=100u64 {
            site.add(ns * 10);
        }

        assert_eq!(site.count, 100);
        let p50 = site.quantile(0.5).unwrap();
        let (lo, hi) = caller_bucket_bounds(caller_bucket_index(500));
        assert!(lo <= p50 && p50 < hi, "p50 {p50} in [{lo}, {hi})");
        let p99 = site.quantile(0.99).unwrap();
        assert!((896..1280).contains(&p99), "p99 {p99}");
        assert_eq!(Site::new(0, 1).quantile(0.5), None);
    }

    #[test]
    fn confirmed_calls_are_kept_per_probe_and_site() {
        let mut confirmed = Confirmed::default();
        confirmed.add(0, 0, 0x10, 5);
        confirmed.add(0, 0, 0x10, 7);
        confirmed.add(0, 1, 0x10, 7);
        confirmed.add(1, 0, 0x20, 9);
        let mut p0: Vec<_> = confirmed
            .of(0)
            .map(|s| (s.ctx, s.addr, s.count, s.sum_ns))
            .collect();
        p0.sort();
        assert_eq!(p0, vec![(0, 0x10, 2, 12), (1, 0x10, 1, 7)]);
        assert_eq!(confirmed.of(1).count(), 1);
    }

    #[test]
    fn the_tracers_own_frames_are_left_out_of_stacks() {
        let stripped = |v: &[&str]| -> Vec<String> {
            strip_tracer_frames(
                v.iter()
                    .enumerate()
                    .map(|(i, n)| (i as u64 + 1, n.to_string()))
                    .collect(),
            )
            .into_iter()
            .map(|x| x.1)
            .collect()
        };

        // fentry on the caller too, call layout: its trampoline, then its patched call.
        assert_eq!(
            stripped(&[
                "__mod_memcg_state+0x7f",
                "bpf_trampoline_6442521123+0x70 [bpf]",
                "__mod_memcg_state+0x9",
                "mod_memcg_state+0x15",
            ]),
            ["__mod_memcg_state+0x7f", "mod_memcg_state+0x15"]
        );

        // Jump layout: no patched call above the trampoline; a caller a few bytes into
        // another function stays.
        assert_eq!(
            stripped(&[
                "obj_cgroup_charge+0xf2",
                "bpf_trampoline_6442521123+0x70 [bpf]",
                "kmalloc_reserve+0x10",
            ]),
            ["obj_cgroup_charge+0xf2", "kmalloc_reserve+0x10"]
        );

        // Nothing of the tracer: unchanged.
        assert_eq!(
            stripped(&["a+0x5", "b+0x9", "c+0x100"]),
            ["a+0x5", "b+0x9", "c+0x100"]
        );
    }

    #[test]
    fn unknown_and_unresolved_addresses_are_named_as_such() {
        let n = Names::default();
        assert_eq!(n.name(0), "unknown");
        assert_eq!(n.name(0xffff_ffff_8100_0000), "0xffffffff81000000");
    }
}
