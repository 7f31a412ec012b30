//! Logical probes (steps of the memcg charging hot path) and their resolution to a kernel symbol
//! and an attach backend on the running kernel.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::kernel::Symbols;

/// How a probe is attached.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// fentry + fexit (BPF trampoline): cheapest, needs BTF for the function.
    Fentry,
    /// kprobe + kretprobe: works where fentry is refused, costs an int3 or ftrace hop.
    Kprobe,
    /// tp_btf on a memcg tracepoint: counts and context only, no latency.
    Tracepoint,
}

impl Backend {
    /// Whether this backend measures latency (entry/exit pairs).
    pub fn has_latency(self) -> bool {
        !matches!(self, Backend::Tracepoint)
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Fentry => "fentry",
            Backend::Kprobe => "kprobe",
            Backend::Tracepoint => "tracepoint",
        })
    }
}

/// The `--attach` choice.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum AttachMode {
    /// Per probe: fentry, else kprobe, else tracepoint.
    #[default]
    Auto,
    /// fentry/fexit only.
    Fentry,
    /// kprobe/kretprobe only.
    Kprobe,
    /// tp_btf tracepoints only.
    Tracepoint,
}

impl AttachMode {
    /// The backends to try, in order. `auto` prefers fentry (the cheapest) except on a
    /// preemptible kernel: there fentry programs run preemptible, and while one is preempted
    /// every call of its function on that CPU is a recursion miss (most calls under load on
    /// Debian 6.18 and 7.3), whereas kprobe programs never run preemptible.
    pub fn order(self, preemptible: bool) -> &'static [Backend] {
        match self {
            AttachMode::Auto if preemptible => {
                &[Backend::Kprobe, Backend::Fentry, Backend::Tracepoint]
            }
            AttachMode::Auto => &[Backend::Fentry, Backend::Kprobe, Backend::Tracepoint],
            AttachMode::Fentry => &[Backend::Fentry],
            AttachMode::Kprobe => &[Backend::Kprobe],
            AttachMode::Tracepoint => &[Backend::Tracepoint],
        }
    }
}

/// Why `auto` put kprobe first, for the probes it attached with kprobe.
pub const NO_SPLIT_NOTE: &str = "auto: kprobe before fentry without the context split (interrupt calls share the task slots, and fentry programs can interleave with them)";

/// Why `auto` puts kprobe first on a preemptible kernel.
pub const PREEMPTIBLE_NOTE: &str = "auto: kprobe before fentry on this preemptible kernel (fentry programs can be preempted holding their recursion guard, and calls are lost meanwhile)";

/// A logical step of the charging path and the kernel symbols that implement it, newest kernels
/// first. The first candidate that exists wins; later ones are wrappers or older names, and
/// tracing both would count one call twice.
#[derive(Debug)]
pub struct ProbeDef {
    /// The name users pass to `--probe`.
    pub name: &'static str,
    /// What it measures.
    pub about: &'static str,
    /// Candidate functions, in order of preference.
    pub candidates: &'static [Candidate],
    /// A tracepoint that fires once per call of this step, for the counts-only backend.
    pub tracepoint: Option<&'static str>,
    /// Traced unless `--probe` says otherwise.
    pub default: bool,
    /// What the step means on kernels of another layout, said with its resolution there.
    pub caveat: Option<Caveat>,
}

/// A probe's meaning on kernels that lack a function marking the layout it was named for.
#[derive(Debug)]
pub struct Caveat {
    /// The marker: where it exists, the caveat does not apply.
    pub unless: &'static str,
    /// What the probe's function means without it.
    pub note: &'static str,
}

/// A kernel function that can implement a probe.
#[derive(Debug)]
pub struct Candidate {
    /// The function.
    pub symbol: &'static str,
    /// Only on kernels that also have this function (a marker of the code layout).
    pub requires: Option<&'static str>,
    /// Why this candidate stands in, shown when it is chosen under `requires`.
    pub why: &'static str,
}

const fn c(symbol: &'static str) -> Candidate {
    Candidate {
        symbol,
        requires: None,
        why: "",
    }
}

/// Every probe memcg-trace knows.
pub const PROBES: &[ProbeDef] = &[
    ProbeDef {
        name: "charge",
        about: "object (kmem/slab) charge to the objcg",
        // 6.16+: the slab hook calls static obj_cgroup_charge_account(); obj_cgroup_charge() is
        // a thin wrapper for the other callers, so tracing both double-counts.
        candidates: &[
            c("obj_cgroup_charge_account"),
            // 7.x inlines obj_cgroup_charge_account() into the slab hook; the hook is then the
            // narrowest traceable function that charges slab objects. __account_obj_stock marks
            // the 6.16+ layout, where obj_cgroup_charge() no longer sees slab charges.
            Candidate {
                symbol: "__memcg_slab_post_alloc_hook",
                requires: Some("__account_obj_stock"),
                why: "obj_cgroup_charge_account is inlined into it on this kernel; the figures include the rest of the slab hook",
            },
            c("obj_cgroup_charge"),
        ],
        tracepoint: None,
        default: true,
        caveat: None,
    },
    ProbeDef {
        name: "stat",
        about: "memcg stat update",
        // Up to 6.15 mod_memcg_state() is an inline around __mod_memcg_state(); 6.16+ made
        // mod_memcg_state() out of line and irq-safe.
        candidates: &[c("__mod_memcg_state"), c("mod_memcg_state")],
        tracepoint: Some("mod_memcg_state"),
        default: true,
        caveat: None,
    },
    ProbeDef {
        name: "rstat",
        about: "rstat updated-tree insertion",
        // cgroup_rstat_updated (4.18-6.15) became css_rstat_updated (6.16); 7.x callers use
        // __css_rstat_updated directly.
        candidates: &[c("__css_rstat_updated"), c("css_rstat_updated"), c("__cgroup_rstat_updated"), c("cgroup_rstat_updated")],
        tracepoint: None,
        default: true,
        // Memcg statistics went onto rstat in 5.13 (its flush callback arrived then); before,
        // the function serves the other controllers (cpu, io) only.
        caveat: Some(Caveat {
            unless: "mem_cgroup_css_rstat_flush",
            note: "not a step of memcg's path on this kernel: memcg statistics go through rstat from 5.13 (mem_cgroup_css_rstat_flush, absent here), and before that its calls are other controllers' (cpu, io) updates",
        }),
    },
    ProbeDef {
        name: "uncharge",
        about: "object uncharge",
        candidates: &[c("obj_cgroup_uncharge")],
        tracepoint: None,
        default: false,
        caveat: None,
    },
    ProbeDef {
        name: "slab_post_alloc",
        about: "slab allocation hook that charges the new objects",
        // 6.10 moved slab charging into __memcg_slab_post_alloc_hook() in mm/memcontrol.c.
        candidates: &[c("__memcg_slab_post_alloc_hook"), c("memcg_slab_post_alloc_hook")],
        tracepoint: None,
        default: false,
        caveat: None,
    },
    ProbeDef {
        name: "slab_free",
        about: "slab free hook that uncharges the objects",
        candidates: &[c("__memcg_slab_free_hook"), c("memcg_slab_free_hook")],
        tracepoint: None,
        default: false,
        caveat: None,
    },
    ProbeDef {
        name: "refill_stock",
        about: "return bytes to the per-CPU object stock",
        candidates: &[c("refill_obj_stock"), c("refill_stock")],
        tracepoint: None,
        default: false,
        caveat: None,
    },
    ProbeDef {
        name: "try_charge",
        about: "page-counter charge (can enter reclaim and sleep)",
        candidates: &[c("try_charge_memcg"), c("try_charge")],
        tracepoint: None,
        default: false,
        caveat: None,
    },
    ProbeDef {
        name: "events",
        about: "memcg event counter update",
        candidates: &[c("count_memcg_events"), c("__count_memcg_events")],
        tracepoint: Some("count_memcg_events"),
        default: false,
        caveat: None,
    },
];

/// Looks a logical probe up by name.
pub fn probe_def(name: &str) -> Option<&'static ProbeDef> {
    PROBES.iter().find(|p| p.name == name)
}

/// The names of the default probes.
pub fn default_probes() -> Vec<&'static str> {
    PROBES
        .iter()
        .filter(|p| p.default)
        .map(|p| p.name)
        .collect()
}

/// What one probe request asks for: a logical probe, or any function (`--func`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// A logical probe from [`PROBES`].
    Probe(&'static ProbeDef),
    /// `--func SYMBOL`.
    Func(String),
}

impl Request {
    /// The name shown for this probe.
    pub fn name(&self) -> String {
        match self {
            Request::Probe(p) => p.name.to_string(),
            Request::Func(f) => f.clone(),
        }
    }
}

impl PartialEq for ProbeDef {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}
impl Eq for ProbeDef {}

/// One way to attach a request that the kernel's symbol tables allow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The backend.
    pub backend: Backend,
    /// The function (fentry, kprobe) or tracepoint (tracepoint) to attach to.
    pub target: String,
}

/// The outcome of resolving one request against the kernel's symbol tables, before any load.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resolution {
    /// Attachable plans in the order they will be tried.
    pub plans: Vec<Plan>,
    /// Why candidates or backends were not chosen, one line each.
    pub notes: Vec<String>,
}

/// Picks, for each backend in `order`, the symbol the request resolves to on this kernel.
pub fn resolve(req: &Request, order: &[Backend], syms: &Symbols) -> Resolution {
    let candidates = candidates_of(req);
    let kernel = Lookup { syms };
    let chosen = kernel.choose(&candidates);
    let mut resolution = Resolution {
        plans: Vec::new(),
        notes: kernel.candidate_notes(&candidates, chosen),
    };
    let chosen = chosen.map(|c| c.symbol);
    if let (Request::Probe(p), Some(sym)) = (req, chosen) {
        if let Some(cv) = p.caveat.as_ref().filter(|cv| !kernel.exists(cv.unless)) {
            resolution.notes.push(format!("{sym}: {}", cv.note));
        }
    }

    let part = chosen.and_then(|sym| kernel.split_part(sym));
    let mut order = order.to_vec();
    if let (Some(sym), Some(part)) = (chosen, part.filter(|_| order.contains(&Backend::Kprobe))) {
        resolution.notes.push(format!(
            "{sym}: split by the compiler: callers in its own file call {part} directly, so kprobe traces {part} (every call past {sym}'s opening check) and fentry on {sym} would see only the calls entering through it"
        ));
        kprobe_before_fentry(&mut order);
    }

    for &backend in &order {
        let plan = match backend {
            Backend::Fentry | Backend::Kprobe => match chosen {
                Some(sym) => kernel.function_plan(backend, sym, part),
                None => Err(format!("{backend}: no candidate function exists")),
            },
            Backend::Tracepoint => kernel.tracepoint_plan(req),
        };
        match plan {
            Ok(plan) => resolution.plans.push(plan),
            Err(note) => resolution.notes.push(note),
        }
    }
    resolution
}

/// A candidate function of a request: borrowed from the static table, or the function the
/// request names.
struct Choice<'a> {
    symbol: &'a str,
    /// Only on kernels that also have this function.
    requires: Option<&'a str>,
    /// Why it stands in, said when it is chosen.
    why: &'a str,
}

/// The candidate functions of a request, in order of preference.
fn candidates_of(req: &Request) -> Vec<Choice<'_>> {
    match req {
        Request::Probe(p) => p
            .candidates
            .iter()
            .map(|c| Choice {
                symbol: c.symbol,
                requires: c.requires,
                why: c.why,
            })
            .collect(),
        Request::Func(f) => vec![Choice {
            symbol: f.as_str(),
            requires: None,
            why: "",
        }],
    }
}

/// What this kernel's symbol tables say of a function.
struct Lookup<'a> {
    syms: &'a Symbols,
}

impl Lookup<'_> {
    /// In BTF or in kallsyms.
    fn exists(&self, sym: &str) -> bool {
        self.syms.btf_funcs.contains(sym) || self.syms.kallsyms.contains(sym)
    }

    /// It exists, and the layout marker it requires too.
    fn usable(&self, c: &Choice) -> bool {
        self.exists(c.symbol) && c.requires.map(|r| self.exists(r)).unwrap_or(true)
    }

    /// Function tracing needs the function in available_filter_functions (or its `.part`
    /// clone, which kprobe then traces); where that list is unreadable, every function is.
    fn traceable(&self, sym: &str) -> bool {
        self.syms.traceable.as_ref().is_none_or(|t| {
            t.contains(sym)
                || self.syms.clones.get(sym).is_some_and(|cs| {
                    cs.iter()
                        .any(|n| n.starts_with(&format!("{sym}.part.")) && t.contains(n))
                })
        })
    }

    /// The first usable and traceable candidate, else the first usable one. A preferred
    /// candidate that exists but is not traceable (inlined at every call site with an unused
    /// out-of-line copy, or notrace: x86 6.12's count_memcg_events) gives way to the next
    /// usable one, which then sees every call.
    fn choose<'c, 'a>(&self, candidates: &'c [Choice<'a>]) -> Option<&'c Choice<'a>> {
        candidates
            .iter()
            .find(|c| self.usable(c) && self.traceable(c.symbol))
            .or_else(|| candidates.iter().find(|c| self.usable(c)))
    }

    /// Why each candidate was chosen or not, one line each (a chosen one only where it says
    /// why it stands in).
    fn candidate_notes(&self, candidates: &[Choice], chosen: Option<&Choice>) -> Vec<String> {
        let mut notes = Vec::new();
        let chosen_sym = chosen.map(|x| x.symbol);
        let position = |sym: &str| candidates.iter().position(|x| x.symbol == sym);
        for c in candidates {
            let sym = c.symbol;
            if chosen_sym == Some(sym) {
                if !c.why.is_empty() {
                    notes.push(format!("{sym}: chosen because {}", c.why));
                }
                continue;
            }

            let note = if self.exists(sym) && !self.usable(c) {
                format!(
                    "{sym}: not used, only stands in on kernels with {}",
                    c.requires.unwrap_or("?")
                )
            } else if self.exists(sym)
                && !self.traceable(sym)
                && chosen_sym.is_some_and(|x| self.traceable(x))
                && position(sym) < chosen_sym.and_then(position)
            {
                format!(
                    "{sym}: not traceable (not in available_filter_functions: inlined at its call sites or notrace), so {} stands in",
                    chosen_sym.unwrap_or("nothing")
                )
            } else if self.exists(sym) {
                format!(
                    "{sym}: not used, {} is preferred (tracing both would count calls twice)",
                    chosen_sym.unwrap_or("?")
                )
            } else if let Some(clones) = self.syms.clones.get(sym) {
                format!(
                    "{sym}: inlined; only compiler clones exist ({})",
                    clones.join(", ")
                )
            } else {
                format!("{sym}: absent from this kernel (BTF and kallsyms; inlined or renamed)")
            };
            notes.push(note);
        }
        notes
    }

    /// The part of a function the compiler split (GCC's partial inlining, `foo.part.N`): `foo`
    /// keeps its opening check and tail-calls the part, and the callers in its own file call
    /// the part directly (5.10's __mod_memcg_state: hackbench's stat updates never enter it).
    /// kprobe then traces the part, which every call past that check runs; fentry cannot (a
    /// clone has no BTF) and is tried after kprobe.
    fn split_part(&self, sym: &str) -> Option<&str> {
        self.syms
            .clones
            .get(sym)?
            .iter()
            .find(|n| n.starts_with(&format!("{sym}.part.")))
            .map(String::as_str)
    }

    /// fentry or kprobe on function `sym` (kprobe on its `part` where the compiler split
    /// it), or why not.
    fn function_plan(
        &self,
        backend: Backend,
        sym: &str,
        part: Option<&str>,
    ) -> Result<Plan, String> {
        if backend == Backend::Fentry && !self.syms.btf_funcs.contains(sym) {
            return Err(format!("fentry: {sym} has no BTF description"));
        }

        let sym = match part {
            Some(part) if backend == Backend::Kprobe => part,
            _ => sym,
        };
        if backend == Backend::Kprobe {
            if !self.syms.kprobes {
                return Err(
                    "kprobe: this kernel has no kprobe support (CONFIG_KPROBES off)".into(),
                );
            }

            if !self.syms.kallsyms.contains(sym) && part != Some(sym) {
                return Err(format!("kprobe: {sym} is not in kallsyms"));
            }
        }

        if let Some(t) = &self.syms.traceable {
            if !t.contains(sym) {
                return Err(format!(
                    "{backend}: {sym} is not traceable (not in available_filter_functions: notrace or inlined)"
                ));
            }
        }
        Ok(Plan {
            backend,
            target: sym.to_string(),
        })
    }

    /// The counts-only tracepoint of the request, or why not.
    fn tracepoint_plan(&self, req: &Request) -> Result<Plan, String> {
        let tp = match req {
            Request::Probe(p) => p.tracepoint,
            Request::Func(_) => None,
        };
        match tp {
            None => Err("tracepoint: no tracepoint fires for this step".into()),
            Some(tp) if self.syms.btf_tracepoints.contains(tp) => Ok(Plan {
                backend: Backend::Tracepoint,
                target: tp.to_string(),
            }),
            Some(tp) => Err(format!(
                "tracepoint: memcg:{tp} does not exist in this kernel"
            )),
        }
    }
}

/// kprobe tried before fentry, where both are in `order` and fentry came first.
fn kprobe_before_fentry(order: &mut [Backend]) {
    let f = order.iter().position(|b| *b == Backend::Fentry);
    let k = order.iter().position(|b| *b == Backend::Kprobe);
    if let (Some(f), Some(k)) = (f, k) {
        if f < k {
            order.swap(f, k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Symbol facts as recorded from the stock kernels in the VM tests (`memcg-trace probes --all`).
    fn kernel(funcs: &[&str], tracepoints: &[&str]) -> Symbols {
        let mut syms = Symbols {
            kprobes: true,
            ..Default::default()
        };
        for f in funcs {
            syms.btf_funcs.insert(f.to_string());
            syms.kallsyms.insert(f.to_string());
        }

        for t in tracepoints {
            syms.btf_tracepoints.insert(t.to_string());
        }
        syms
    }

    fn chosen(s: &Symbols, probe: &str) -> String {
        let r = resolve(
            &Request::Probe(probe_def(probe).unwrap()),
            AttachMode::Auto.order(false),
            s,
        );
        r.plans
            .first()
            .map(|p| p.target.clone())
            .unwrap_or_default()
    }

    #[test]
    fn stock_kernels_resolve_to_the_hot_path() {
        let k61 = kernel(
            &[
                "obj_cgroup_charge",
                "__mod_memcg_state",
                "__cgroup_rstat_updated",
                "cgroup_rstat_updated",
                "mem_cgroup_css_rstat_flush",
            ],
            &[],
        );
        let k612 = kernel(
            &[
                "obj_cgroup_charge",
                "__memcg_slab_post_alloc_hook",
                "__mod_memcg_state",
                "__cgroup_rstat_updated",
                "cgroup_rstat_updated",
                "mem_cgroup_css_rstat_flush",
            ],
            &["mod_memcg_state"],
        );
        let k618 = kernel(
            &[
                "obj_cgroup_charge",
                "obj_cgroup_charge_account",
                "__memcg_slab_post_alloc_hook",
                "__account_obj_stock",
                "mod_memcg_state",
                "css_rstat_updated",
                "mem_cgroup_css_rstat_flush",
            ],
            &["mod_memcg_state"],
        );

        // 7.3 inlines obj_cgroup_charge_account into the slab hook (seen in its kallsyms).
        let k73 = kernel(
            &[
                "obj_cgroup_charge",
                "__memcg_slab_post_alloc_hook",
                "__account_obj_stock",
                "mod_memcg_state",
                "css_rstat_updated",
                "__css_rstat_updated",
                "mem_cgroup_css_rstat_flush",
            ],
            &["mod_memcg_state"],
        );
        for (k, charge, stat, rstat) in [
            (
                &k61,
                "obj_cgroup_charge",
                "__mod_memcg_state",
                "__cgroup_rstat_updated",
            ),
            (
                &k612,
                "obj_cgroup_charge",
                "__mod_memcg_state",
                "__cgroup_rstat_updated",
            ),
            (
                &k618,
                "obj_cgroup_charge_account",
                "mod_memcg_state",
                "css_rstat_updated",
            ),
            (
                &k73,
                "__memcg_slab_post_alloc_hook",
                "mod_memcg_state",
                "__css_rstat_updated",
            ),
        ] {
            assert_eq!(chosen(k, "charge"), charge);
            assert_eq!(chosen(k, "stat"), stat);
            assert_eq!(chosen(k, "rstat"), rstat);
            assert!(
                !rstat_notes(k)
                    .iter()
                    .any(|n| n.contains("not a step of memcg")),
                "{rstat}: memcg's stats are on rstat here"
            );
        }
    }

    fn rstat_notes(s: &Symbols) -> Vec<String> {
        resolve(
            &Request::Probe(probe_def("rstat").unwrap()),
            AttachMode::Auto.order(false),
            s,
        )
        .notes
    }

    /// 5.10 (Debian 11, seen in the VM): memcg statistics are not on rstat yet, so the function
    /// `rstat` resolves to is other controllers' step, and its resolution says so.
    #[test]
    fn rstat_before_5_13_says_it_is_not_memcgs_step() {
        let k510 = kernel(
            &[
                "obj_cgroup_charge",
                "__mod_memcg_state",
                "cgroup_rstat_updated",
            ],
            &[],
        );
        assert_eq!(chosen(&k510, "charge"), "obj_cgroup_charge");
        assert_eq!(chosen(&k510, "stat"), "__mod_memcg_state");
        assert_eq!(chosen(&k510, "rstat"), "cgroup_rstat_updated");
        let notes = rstat_notes(&k510);
        assert!(
            notes.iter().any(
                |n| n.starts_with("cgroup_rstat_updated: not a step of memcg's path")
                    && n.contains("5.13")
            ),
            "{notes:?}"
        );
    }

    #[test]
    fn host_without_function_tracing_falls_back_to_the_tracepoint() {
        let mut host = kernel(
            &[
                "obj_cgroup_charge_account",
                "obj_cgroup_charge",
                "mod_memcg_state",
                "__css_rstat_updated",
            ],
            &["mod_memcg_state"],
        );
        host.kprobes = false;
        let stat = resolve(
            &Request::Probe(probe_def("stat").unwrap()),
            AttachMode::Auto.order(false),
            &host,
        );
        let backends: Vec<_> = stat.plans.iter().map(|p| p.backend).collect();
        assert_eq!(backends, vec![Backend::Fentry, Backend::Tracepoint]);
        assert!(
            stat.notes.iter().any(|n| n.contains("CONFIG_KPROBES")),
            "{:?}",
            stat.notes
        );
        let charge = resolve(
            &Request::Probe(probe_def("charge").unwrap()),
            &[Backend::Tracepoint],
            &host,
        );
        assert!(charge.plans.is_empty());
        assert!(charge
            .notes
            .iter()
            .any(|n| n.contains("obj_cgroup_charge: not used")));
    }

    #[test]
    fn inlined_candidates_are_explained() {
        let mut host = kernel(&["__mod_memcg_state"], &[]);
        host.clones.insert(
            "mod_memcg_state".into(),
            vec!["mod_memcg_state.constprop.0".into()],
        );
        let resolution = resolve(
            &Request::Probe(probe_def("stat").unwrap()),
            &[Backend::Kprobe],
            &host,
        );
        assert_eq!(resolution.plans[0].target, "__mod_memcg_state");
        assert!(
            resolution
                .notes
                .iter()
                .any(|n| n.contains("inlined") && n.contains("constprop")),
            "{:?}",
            resolution.notes
        );
    }

    /// 5.10's __mod_memcg_state: the compiler split it, its file's callers call the part.
    #[test]
    fn a_split_function_is_traced_at_its_part_by_kprobe_first() {
        let mut host = kernel(&["__mod_memcg_state"], &[]);
        host.clones.insert(
            "__mod_memcg_state".into(),
            vec!["__mod_memcg_state.part.0".into()],
        );
        host.traceable = Some(
            ["__mod_memcg_state", "__mod_memcg_state.part.0"]
                .iter()
                .map(|s| s.to_string())
                .collect(),
        );
        let stat = Request::Probe(probe_def("stat").unwrap());
        let resolution = resolve(&stat, AttachMode::Auto.order(false), &host);
        let plans: Vec<(Backend, &str)> = resolution
            .plans
            .iter()
            .map(|p| (p.backend, p.target.as_str()))
            .collect();
        assert_eq!(
            &plans[..2],
            &[
                (Backend::Kprobe, "__mod_memcg_state.part.0"),
                (Backend::Fentry, "__mod_memcg_state")
            ],
            "{:?}",
            resolution.notes
        );
        assert!(
            resolution
                .notes
                .iter()
                .any(|n| n.contains("split by the compiler")),
            "{:?}",
            resolution.notes
        );

        // Forced fentry keeps the function itself, with the note; other clones change nothing.
        let forced = resolve(&stat, &[Backend::Fentry], &host);
        assert_eq!(forced.plans[0].target, "__mod_memcg_state");
        host.clones.insert(
            "__mod_memcg_state".into(),
            vec!["__mod_memcg_state.constprop.0".into()],
        );
        let r = resolve(&stat, AttachMode::Auto.order(false), &host);
        assert_eq!(
            (r.plans[0].backend, r.plans[0].target.as_str()),
            (Backend::Fentry, "__mod_memcg_state")
        );
    }

    /// x86 6.12: `count_memcg_events` is in BTF and kallsyms but not traceable (inlined at its
    /// call sites), and arm64 6.12 has only `__count_memcg_events`: both must trace
    /// `__count_memcg_events` (x86 6.12 traced nothing for `events` before).
    #[test]
    fn an_untraceable_preferred_candidate_gives_way() {
        let mut x86 = kernel(&["count_memcg_events", "__count_memcg_events"], &[]);
        x86.traceable = Some(["__count_memcg_events".to_string()].into_iter().collect());
        assert_eq!(chosen(&x86, "events"), "__count_memcg_events");
        let resolution = resolve(
            &Request::Probe(probe_def("events").unwrap()),
            AttachMode::Auto.order(false),
            &x86,
        );
        assert!(
            resolution
                .notes
                .iter()
                .any(|n| n.starts_with("count_memcg_events: not traceable")
                    && n.ends_with("so __count_memcg_events stands in")),
            "{:?}",
            resolution.notes
        );
        let mut arm64 = kernel(&["__count_memcg_events"], &[]);
        arm64.traceable = Some(["__count_memcg_events".to_string()].into_iter().collect());
        assert_eq!(chosen(&arm64, "events"), "__count_memcg_events");

        // Where both are traceable the preferred one stays (tracing both counts twice).
        x86.traceable = Some(
            ["count_memcg_events", "__count_memcg_events"]
                .into_iter()
                .map(String::from)
                .collect(),
        );
        assert_eq!(chosen(&x86, "events"), "count_memcg_events");
    }

    #[test]
    fn untraceable_function_is_refused_with_reason() {
        let mut k = kernel(&["obj_cgroup_charge"], &[]);
        k.traceable = Some(Default::default());
        let resolution = resolve(
            &Request::Func("obj_cgroup_charge".into()),
            AttachMode::Auto.order(false),
            &k,
        );
        assert!(resolution.plans.is_empty());
        assert_eq!(
            resolution
                .notes
                .iter()
                .filter(|n| n.contains("not traceable"))
                .count(),
            2
        );
    }
}
