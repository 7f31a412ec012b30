//! Facts about the running kernel: which functions and tracepoints exist (BTF, kallsyms,
//! available_filter_functions), the struct and per-CPU offsets the eBPF programs need, and the
//! build configuration worth recording next to a measurement.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    fs,
    io::{BufRead as _, BufReader, Read as _},
    path::Path,
};

use anyhow::{anyhow, bail, Context as _, Result};
use btf_rs::{Backend, Btf, BtfType, Type};
use fallible_iterator::FallibleIterator as _;
use memcg_trace_common::{KernelLayout, CTX_NAMES, PREEMPT_MASKS};

/// The name of context `i` in tables, the JSON and metrics: `all` for context 0 where there is
/// no context split (`split` false: every call is counted there), else task, softirq, hardirq,
/// nmi.
pub fn ctx_name(i: usize, split: bool) -> &'static str {
    if i == 0 && !split {
        "all"
    } else {
        CTX_NAMES[i % CTX_NAMES.len()]
    }
}

/// The index of a context named in a recording (`all`: 0, a recording without the split).
pub fn ctx_index(name: &str) -> Option<usize> {
    if name == "all" {
        return Some(0);
    }
    CTX_NAMES.iter().position(|n| *n == name)
}

/// Where the running kernel's BTF lives.
pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// What exists in this kernel, by name. Built once per run (kallsyms is slow under emulation).
#[derive(Debug, Default, Clone)]
pub struct Symbols {
    /// Functions described in vmlinux BTF (fentry/fexit can target these).
    pub btf_funcs: HashSet<String>,
    /// Tracepoints with a BTF prototype (`btf_trace_<name>`), attachable as tp_btf.
    pub btf_tracepoints: HashSet<String>,
    /// Text symbols from /proc/kallsyms, exact names (kprobes can target these).
    pub kallsyms: HashSet<String>,
    /// Compiler clones by base name: `foo` -> [`foo.constprop.0`].
    pub clones: HashMap<String, Vec<String>>,
    /// /sys/kernel/tracing/available_filter_functions, when readable.
    pub traceable: Option<HashSet<String>>,
    /// Whether the kernel can create kprobes at all.
    pub kprobes: bool,
}

impl Symbols {
    /// Reads BTF, kallsyms and the ftrace function list of the running kernel, keeping only the
    /// names in `interest` (function names; tracepoint names as they follow `btf_trace_`):
    /// the full tables are over a hundred thousand names each.
    pub fn load(btf: &Btf, interest: &HashSet<String>) -> Result<Self> {
        let mut syms = Symbols::default();
        let mut types = btf.type_iter();
        while let Ok(Some(t)) = types.next() {
            match &t {
                Type::Func(f) => {
                    if let Ok(n) = btf.resolve_name(f) {
                        if interest.contains(&n) {
                            syms.btf_funcs.insert(n);
                        }
                    }
                }
                Type::Typedef(td) => {
                    if let Ok(n) = btf.resolve_name(td) {
                        if let Some(tp) = n.strip_prefix("btf_trace_") {
                            if interest.contains(tp) {
                                syms.btf_tracepoints.insert(tp.to_string());
                            }
                        }
                    }
                }
                _ => {}
            }
        }

        // Streamed: with CONFIG_KALLSYMS_ALL the listing is over 10 MiB, which would otherwise
        // be the daemon's peak memory.
        let kallsyms = fs::File::open("/proc/kallsyms").context("read /proc/kallsyms")?;
        for line in BufReader::new(kallsyms).lines() {
            syms.add_kallsyms_line(&line.context("read /proc/kallsyms")?, Some(interest));
        }

        for dir in ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"] {
            if let Ok(f) = fs::File::open(format!("{dir}/available_filter_functions")) {
                syms.traceable = Some(
                    BufReader::new(f)
                        .lines()
                        .map_while(Result::ok)
                        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
                        .filter(|n| {
                            // Compiler clones of the functions of interest too (`foo.part.0`).
                            interest.contains(n)
                                || n.split_once('.').is_some_and(|(b, _)| interest.contains(b))
                        })
                        .collect(),
                );
                break;
            }
        }

        syms.kprobes = Path::new("/sys/bus/event_source/devices/kprobe").exists();
        Ok(syms)
    }

    /// Adds the text symbols of a /proc/kallsyms listing (those in `interest`, if given, and
    /// their compiler clones).
    pub fn add_kallsyms(&mut self, kallsyms: &str, interest: Option<&HashSet<String>>) {
        for line in kallsyms.lines() {
            self.add_kallsyms_line(line, interest);
        }
    }

    /// Adds one line of a /proc/kallsyms listing (see `add_kallsyms`).
    pub fn add_kallsyms_line(&mut self, line: &str, interest: Option<&HashSet<String>>) {
        let wanted = |n: &str| interest.map(|i| i.contains(n)).unwrap_or(true);
        let mut it = line.split_whitespace();
        let (Some(_addr), Some(kind), Some(name)) = (it.next(), it.next(), it.next()) else {
            return;
        };
        if !matches!(kind, "t" | "T") {
            return;
        }

        match name.split_once('.') {
            Some((base, _)) if !wanted(base) => {}
            None if !wanted(name) => {}
            Some((base, _)) => self
                .clones
                .entry(base.to_string())
                .or_default()
                .push(name.to_string()),
            None => {
                self.kallsyms.insert(name.to_string());
            }
        }
    }
}

/// The release of the running kernel (`uname -r`).
pub fn release() -> String {
    fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// Opens the running kernel's BTF, with a clear error when there is none.
pub fn open_btf() -> Result<Btf> {
    if !Path::new(VMLINUX_BTF).exists() {
        bail!("{VMLINUX_BTF} is missing: this kernel was built without CONFIG_DEBUG_INFO_BTF, which memcg-trace needs");
    }

    // The mmap backend parses lazily: a fraction of the memory of the caching one (tens of MiB
    // for vmlinux). Kernels before 6.16 cannot mmap the sysfs file, so it is copied into a
    // memfd first.
    if let Ok(btf) = Btf::from_file_with_backend(VMLINUX_BTF, Backend::Mmap) {
        return Ok(btf);
    }

    let data = fs::read(VMLINUX_BTF).map_err(|e| anyhow!("cannot read {VMLINUX_BTF}: {e}"))?;

    // SAFETY: memfd_create with a valid C string; the fd is owned by the File below.
    let fd = unsafe { libc::memfd_create(c"memcg-trace-btf".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Btf::from_bytes(&data).map_err(|e| anyhow!("cannot parse {VMLINUX_BTF}: {e}"));
    }

    // SAFETY: fd was just created and is owned by nobody else.
    let mut f = unsafe { <fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    std::io::Write::write_all(&mut f, &data)?;
    drop(data);
    Btf::from_file_with_backend(format!("/proc/self/fd/{fd}"), Backend::Mmap)
        .map_err(|e| anyhow!("cannot parse {VMLINUX_BTF}: {e}"))
}

fn named_struct(btf: &Btf, name: &str) -> Result<btf_rs::Struct> {
    for t in btf.resolve_types_by_name(name).unwrap_or_default() {
        if let Type::Struct(s) = t {
            if !s.members.is_empty() {
                return Ok(s);
            }
        }
    }

    bail!("struct {name} not found in BTF")
}

/// Follows typedefs and qualifiers to the underlying type.
fn strip(btf: &Btf, mut t: Type) -> Result<Type> {
    loop {
        match &t {
            Type::Typedef(_)
            | Type::Volatile(_)
            | Type::Const(_)
            | Type::Restrict(_)
            | Type::TypeTag(_) => {
                t = btf
                    .resolve_chained_type(t.as_btf_type().expect("qualifier is a btf type"))
                    .map_err(|e| anyhow!("{e}"))?;
            }
            _ => return Ok(t),
        }
    }
}

/// Byte offset of `field` in `s`, looking through anonymous structs and unions.
fn member_offset(btf: &Btf, s: &btf_rs::Struct, field: &str) -> Option<(u64, Type)> {
    for m in &s.members {
        let name = btf.resolve_name(m).unwrap_or_default();
        let ty = btf.resolve_chained_type(m).ok()?;
        if name == field {
            return Some(((m.bit_offset() / 8) as u64, ty));
        }

        if name.is_empty() {
            if let Ok(Type::Struct(inner) | Type::Union(inner)) = strip(btf, ty) {
                if let Some((off, t)) = member_offset(btf, &inner, field) {
                    return Some((m.bit_offset() as u64 / 8 + off, t));
                }
            }
        }
    }
    None
}

/// Offset of a dotted path of fields starting at struct `root`.
pub fn field_path_offset(btf: &Btf, root: &str, path: &[&str]) -> Result<u64> {
    let mut container = named_struct(btf, root)?;
    let mut total = 0;
    for (i, field) in path.iter().enumerate() {
        let (off, ty) = member_offset(btf, &container, field)
            .ok_or_else(|| anyhow!("{root}.{} not found in BTF", path[..=i].join(".")))?;
        total += off;
        if i + 1 < path.len() {
            match strip(btf, ty)? {
                Type::Struct(next) | Type::Union(next) => container = next,
                Type::Ptr(_) => bail!(
                    "{root}.{} is a pointer; split the path",
                    path[..=i].join(".")
                ),
                other => bail!("{root}.{} is a {}", path[..=i].join("."), other.name()),
            }
        }
    }
    Ok(total)
}

/// The struct a function's first parameter points to (`tracepoint`: the first argument of the
/// BTF tracepoint `btf_trace_<name>`, after its `void *` data), by name; None when it is not a
/// pointer to a struct or the name is not in BTF.
pub fn first_arg_struct(btf: &Btf, name: &str, tracepoint: bool) -> Option<String> {
    let proto = if tracepoint {
        let td = btf
            .resolve_types_by_name(&format!("btf_trace_{name}"))
            .ok()?
            .into_iter()
            .find(|t| matches!(t, Type::Typedef(_)))?;
        let Type::Ptr(p) = strip(btf, td).ok()? else {
            return None;
        };
        match strip(btf, btf.resolve_chained_type(&p).ok()?).ok()? {
            Type::FuncProto(fp) => fp,
            _ => return None,
        }
    } else {
        let Some(Type::Func(f)) = btf
            .resolve_types_by_name(name)
            .ok()?
            .into_iter()
            .find(|t| matches!(t, Type::Func(_)))
        else {
            return None;
        };
        match btf.resolve_chained_type(&f).ok()? {
            Type::FuncProto(fp) => fp,
            _ => return None,
        }
    };
    let param = proto.parameters.get(usize::from(tracepoint))?;
    let Type::Ptr(p) = strip(btf, btf.resolve_chained_type(param).ok()?).ok()? else {
        return None;
    };
    match strip(btf, btf.resolve_chained_type(&p).ok()?).ok()? {
        Type::Struct(s) => btf.resolve_name(&s).ok(),
        _ => None,
    }
}

/// The structs a charged memcg can be read from (see [`memcg_path`]).
pub const MEMCG_ARGS: [&str; 5] = [
    "mem_cgroup",
    "obj_cgroup",
    "lruvec",
    "cgroup_subsys_state",
    "cgroup",
];

/// How the programs reach the id of the memcg (its cgroup's `kernfs_node`) from a pointer to
/// `arg` (one of [`MEMCG_ARGS`]), with this kernel's offsets: a `mem_cgroup` through its css's
/// cgroup, an `obj_cgroup` through the memcg it charges now (its parent's once reparented), a
/// memcg's `lruvec` through the per-node struct holding it (`container_of`), a css or a
/// cgroup directly, once checked to be the memory controller's (a css's controller; a
/// cgroup's hierarchy must hold the memory controller).
pub fn memcg_path(btf: &Btf, arg: &str) -> Result<memcg_trace_common::MemcgPath> {
    let off = |root: &str, path: &[&str]| -> Result<i32> {
        let o = field_path_offset(btf, root, path)?;
        i32::try_from(o).map_err(|_| anyhow!("{root}.{}: offset {o} too large", path.join(".")))
    };
    let css_cgroup = || off("cgroup_subsys_state", &["cgroup"]);
    let memcg_cgroup = || Ok::<_, anyhow::Error>(off("mem_cgroup", &["css"])? + css_cgroup()?);
    let kn = off("cgroup", &["kn"])?;
    let hops: Vec<i32> = match arg {
        "cgroup" => vec![kn],
        "cgroup_subsys_state" => vec![css_cgroup()?, kn],
        "mem_cgroup" => vec![memcg_cgroup()?, kn],
        "obj_cgroup" => vec![off("obj_cgroup", &["memcg"])?, memcg_cgroup()?, kn],
        "lruvec" => vec![
            off("mem_cgroup_per_node", &["memcg"])? - off("mem_cgroup_per_node", &["lruvec"])?,
            memcg_cgroup()?,
            kn,
        ],
        other => bail!("a struct {other} does not lead to a memcg"),
    };

    // The way up, for memcgs made below the workload's after userspace last looked: the
    // field is `__parent` from 6.15 (read under RCU there; a fault-safe read here). 0 where
    // neither is found: no climb, such memcgs count from the next tick.
    let parent_off = ["parent", "__parent"]
        .iter()
        .find_map(|f| field_path_offset(btf, "kernfs_node", &[f]).ok())
        .unwrap_or(0);
    let mut route = memcg_trace_common::MemcgPath {
        hops: hops.len() as u32,
        id_off: off("kernfs_node", &["id"])? as u32,
        parent_off: u32::try_from(parent_off).unwrap_or(0),
        ..Default::default()
    };
    route.off[..hops.len()].copy_from_slice(&hops);

    // A cgroup or css is the memory controller's only if it says so.
    let memory = || {
        enum_value(btf, "cgroup_subsys_id", "memory_cgrp_id")
            .ok_or_else(|| anyhow!("memory_cgrp_id not in BTF"))
    };
    match arg {
        "cgroup_subsys_state" => {
            route.check_hops = 1;
            route.check_off[0] = off("cgroup_subsys_state", &["ss"])?;
            route.check_field = off("cgroup_subsys", &["id"])? as u32;
            route.check_mask = u32::MAX;
            route.check_want = memory()?;
        }
        "cgroup" => {
            route.check_hops = 1;
            route.check_off[0] = off("cgroup", &["root"])?;
            route.check_field = off("cgroup_root", &["subsys_mask"])? as u32;
            route.check_mask = 1 << memory()?;
            route.check_want = route.check_mask;
        }
        _ => {}
    }
    Ok(route)
}

/// The value of enumerator `member` of `enum name` in BTF.
pub fn enum_value(btf: &Btf, name: &str, member: &str) -> Option<u32> {
    btf.resolve_types_by_name(name)
        .ok()?
        .into_iter()
        .find_map(|t| match t {
            Type::Enum(e) => e
                .members
                .iter()
                .find(|m| btf.resolve_name(*m).is_ok_and(|n| n == member))
                .map(|m| m.val()),
            _ => None,
        })
}

/// The per-CPU variables the layout is built from.
const PERCPU_NAMES: &[&str] = &[
    "__preempt_count",
    "pcpu_hot",
    "runqueues",
    "this_cpu_off",
    "current_task",
    "bpf_prog_active",
];

/// Per-CPU variables and their offsets in the per-CPU area: from BTF's `.data..percpu`
/// section, or, where BTF has none (Debian 11's 5.10: its build skips BTF variables), from
/// /proc/kallsyms (true in the second field).
pub fn percpu_vars(btf: &Btf) -> Result<(HashMap<String, u64>, bool)> {
    let from_btf = percpu_vars_btf(btf);
    if !from_btf.is_empty() {
        return Ok((from_btf, false));
    }

    let vars = fs::File::open("/proc/kallsyms")
        .map_err(|e| format!("cannot read it: {e}"))
        .and_then(|f| {
            percpu_from_kallsyms(
                BufReader::new(f).lines().map_while(Result::ok),
                PERCPU_NAMES,
            )
        })
        .map_err(|why| {
            anyhow!("no per-CPU offsets to find the preempt count by: no .data..percpu section in BTF, and /proc/kallsyms does not give them either ({why})")
        })?;
    Ok((vars, true))
}

/// The offsets of the per-CPU symbols `names` in kallsyms `lines`: on x86-64 the per-CPU area
/// is linked from `__per_cpu_start` (0 up to 6.14), and its symbols are listed with their
/// link addresses (type `A`, not moved by KASLR), in address order, before every other
/// symbol; reading stops at the first other one. An error when none of `names` is there
/// (a kernel without CONFIG_KALLSYMS_ALL lists no variables), or when the addresses are
/// hidden (`kptr_restrict`: all zero).
pub fn percpu_from_kallsyms(
    lines: impl IntoIterator<Item = impl AsRef<str>>,
    names: &[&str],
) -> Result<HashMap<String, u64>, String> {
    let mut start = None;
    let mut out = HashMap::new();
    let mut nonzero = false;
    for l in lines {
        let mut cols = l.as_ref().split_whitespace();
        let (Some(addr), Some(kind), Some(name)) = (cols.next(), cols.next(), cols.next()) else {
            continue;
        };
        let Ok(addr) = u64::from_str_radix(addr, 16) else {
            continue;
        };
        nonzero |= addr != 0;
        let absolute = kind.eq_ignore_ascii_case("a");
        if !absolute && start.is_some() {
            // Past the per-CPU area's symbols.
            break;
        }

        // A module's symbol (a fourth field, `[module]`) is never a per-CPU one of vmlinux.
        if !absolute || cols.next().is_some() {
            continue;
        }

        if name == "__per_cpu_start" {
            start = Some(addr);
        } else if names.contains(&name) {
            out.insert(name.to_string(), addr);
        }
    }

    if !nonzero {
        return Err("its addresses read as zero: kptr_restrict hides them".into());
    }

    if out.is_empty() {
        return Err(format!(
            "none of {} listed as a per-CPU symbol (they are only with CONFIG_KALLSYMS_ALL)",
            names.join(", ")
        ));
    }

    let start = start.unwrap_or(0);
    for v in out.values_mut() {
        *v = v.wrapping_sub(start);
    }
    Ok(out)
}

/// Per-CPU variables and their offsets in BTF's `.data..percpu` section (empty: none).
fn percpu_vars_btf(btf: &Btf) -> HashMap<String, u64> {
    let mut out = HashMap::new();
    for t in btf
        .resolve_types_by_name(".data..percpu")
        .unwrap_or_default()
    {
        if let Type::Datasec(ds) = t {
            for v in &ds.variables {
                if let Ok(var) = btf.resolve_type_by_id(v.get_type_id().unwrap_or(0)) {
                    if let Some(bt) = var.as_btf_type() {
                        if let Ok(name) = btf.resolve_name(bt) {
                            out.insert(name, v.offset() as u64);
                        }
                    }
                }
            }
        }
    }
    out
}

/// The address kallsyms gives symbol `name` (None: absent, or hidden as 0 by kptr_restrict).
pub fn kallsyms_addr(name: &str) -> Option<u64> {
    let f = fs::File::open("/proc/kallsyms").ok()?;
    BufReader::new(f)
        .lines()
        .map_while(Result::ok)
        .find_map(|l| {
            let mut w = l.split_whitespace();
            let addr = w.next()?;
            (w.nth(1) == Some(name)).then(|| u64::from_str_radix(addr, 16).ok())?
        })
        .filter(|a| *a != 0)
}

/// Whether /proc/kallsyms lists `name` (any symbol type). Per-CPU variables, when listed, come
/// first (lowest addresses), so a present one is found after a few lines.
pub fn kallsyms_has(name: &str) -> bool {
    let Ok(f) = fs::File::open("/proc/kallsyms") else {
        return false;
    };
    BufReader::new(f)
        .lines()
        .map_while(Result::ok)
        .any(|l| l.split_whitespace().nth(2) == Some(name))
}

/// The BTF id of the variable (BTF_KIND_VAR) `name`.
pub fn var_id(btf: &Btf, name: &str) -> Option<u32> {
    btf.resolve_ids_by_name(name)
        .ok()?
        .into_iter()
        .find(|id| matches!(btf.resolve_type_by_id(*id), Ok(Type::Var(_))))
}

/// The BTF ids of the kfunc `bpf_rdonly_cast` (6.2+) and of the struct behind `atomic_t`,
/// whose first member, an `int` at offset 0, is what the programs read through the cast.
pub fn rdonly_cast_ids(btf: &Btf) -> Option<(u32, u32)> {
    let func = btf
        .resolve_ids_by_name("bpf_rdonly_cast")
        .ok()?
        .into_iter()
        .find(|id| matches!(btf.resolve_type_by_id(*id), Ok(Type::Func(_))))?;
    Some((func, typedef_struct_with_first(btf, "atomic_t", 4)?))
}

/// The id of the struct the typedef `name` stands for, if it is `size` bytes and its first
/// member is an integer of that size at offset 0.
fn typedef_struct_with_first(btf: &Btf, name: &str, size: usize) -> Option<u32> {
    let strukt = btf
        .resolve_ids_by_name(name)
        .ok()?
        .into_iter()
        .find_map(|id| match btf.resolve_type_by_id(id) {
            Ok(Type::Typedef(t)) => t.get_type_id(),
            _ => None,
        })?;
    let Ok(Type::Struct(s)) = btf.resolve_type_by_id(strukt) else {
        return None;
    };
    let first = s.members.first()?;
    let mut ty = btf.resolve_chained_type(first).ok()?;

    // Through typedefs (`s64`), at most a few.
    for _ in 0..8 {
        match ty {
            Type::Typedef(td) => ty = btf.resolve_chained_type(&td).ok()?,
            _ => break,
        }
    }

    let int = matches!(ty, Type::Int(i) if i.size() == size);
    (s.size() == size && first.bit_offset() == 0 && int).then_some(strukt)
}

/// The id of the named struct `name`.
fn named_struct_id(btf: &Btf, name: &str) -> Option<u32> {
    btf.resolve_ids_by_name(name)
        .ok()?
        .into_iter()
        .find(|id| matches!(btf.resolve_type_by_id(*id), Ok(Type::Struct(_))))
}

/// Where the programs read the preempt count: a per-CPU variable (`var`, its `member` at
/// `offset` from the per-CPU base), or on arm64 the running task's (`offset` into it).
struct PreemptAt {
    var: &'static str,
    member: u64,
    offset: u64,
}

/// [`PreemptAt`] for this kernel; nothing to read without the context split.
fn preempt_at(
    btf: &Btf,
    percpu: &HashMap<String, u64>,
    no_context: bool,
    arm64: bool,
) -> Result<PreemptAt> {
    // arm64: the preempt count is the running task's (thread_info, the first member of
    // task_struct with THREAD_INFO_IN_TASK), read through `current`, no per-CPU variable.
    let task_preempt = if arm64 && !no_context {
        Some(
            field_path_offset(btf, "task_struct", &["thread_info", "preempt_count"])
                .context("task_struct.thread_info.preempt_count (arm64)")?,
        )
    } else {
        None
    };

    // x86, up to 6.1 and again from 6.15: `__preempt_count`; 6.2-6.14: `pcpu_hot.preempt_count`.
    let (var, preempt_member) = if no_context || arm64 {
        ("", 0)
    } else if percpu.contains_key("__preempt_count") {
        ("__preempt_count", 0)
    } else if percpu.contains_key("pcpu_hot") {
        (
            "pcpu_hot",
            field_path_offset(btf, "pcpu_hot", &["preempt_count"])?,
        )
    } else {
        bail!("neither __preempt_count nor pcpu_hot is a per-CPU variable (BTF, kallsyms)");
    };
    let preempt_count = match task_preempt {
        Some(o) => o,
        None => percpu.get(var).map_or(0, |o| o + preempt_member),
    };
    Ok(PreemptAt {
        var,
        member: preempt_member,
        offset: preempt_count,
    })
}

/// The reads of a task's cgroup v2: `id_path` (`task->cgroups->dfl_cgrp->kn->id`, as
/// `bpf_get_current_cgroup_id` reads it; zeros where one is missing), and a cgroup's
/// ancestors by depth (offset, and whether they are ids).
struct CgroupReads {
    id_path: (u64, u64, u64, u64),
    ancestors: Option<(u64, bool)>,
}

fn cgroup_reads(btf: &Btf) -> CgroupReads {
    // current->cgroups->dfl_cgrp->kn->id, as bpf_get_current_cgroup_id reads it.
    let id_path = (|| {
        Some((
            field_path_offset(btf, "task_struct", &["cgroups"]).ok()?,
            field_path_offset(btf, "css_set", &["dfl_cgrp"]).ok()?,
            field_path_offset(btf, "cgroup", &["kn"]).ok()?,
            field_path_offset(btf, "kernfs_node", &["id"]).ok()?,
        ))
    })()
    .unwrap_or((0, 0, 0, 0));

    // A cgroup's ancestors by depth: their ids before 6.0 (`ancestor_ids[]`), then pointers.
    let ancestors = match field_path_offset(btf, "cgroup", &["ancestor_ids"]) {
        Ok(o) => Some((o, true)),
        Err(_) => field_path_offset(btf, "cgroup", &["ancestors"])
            .ok()
            .map(|o| (o, false)),
    };
    CgroupReads { id_path, ancestors }
}

/// The BTF ids and per-CPU offset to read the running task by a cast (`bpf_rdonly_cast`):
/// (u64's, task_struct's, `current`'s offset), where the kernel has the kfunc (`cast`).
fn current_task_cast(
    btf: &Btf,
    percpu: &HashMap<String, u64>,
    cast: Option<(u32, u32)>,
) -> Option<(u32, u32, u64)> {
    // x86: `current` is a per-CPU pointer (`current_task`; `pcpu_hot.current_task` 6.2-6.14).
    (|| {
        cast?;
        let at = match percpu.get("current_task") {
            Some(o) => *o,
            None => {
                percpu.get("pcpu_hot")?
                    + field_path_offset(btf, "pcpu_hot", &["current_task"]).ok()?
            }
        };
        Some((
            typedef_struct_with_first(btf, "atomic64_t", 8)?,
            named_struct_id(btf, "task_struct")?,
            at,
        ))
    })()
}

/// What tells interrupt work done in tasks from other task work: the offset of the task's
/// softirq count on PREEMPT_RT, which counts softirqs in the task, not in preempt_count (see
/// `KernelLayout::task_softirq`; every RT build has the field: were one to lack it, softirq
/// would read as task there rather than the tool refusing to trace), and of the task's name
/// where threads do interrupt work (the programs tell them by name). Zeros where not needed.
fn interrupt_work_in_tasks(btf: &Btf, no_context: bool) -> Result<(u64, u64)> {
    let task_softirq = if realtime() && !no_context {
        field_path_offset(btf, "task_struct", &["softirq_disable_cnt"]).unwrap_or(0)
    } else {
        0
    };
    let threaded = realtime()
        || fs::read_to_string("/proc/cmdline")
            .is_ok_and(|c| c.split_whitespace().any(|w| w == "threadirqs"));
    let task_comm = if threaded {
        field_path_offset(btf, "task_struct", &["comm"])?
    } else {
        0
    };
    Ok((task_softirq, task_comm))
}

/// Whether two CPUs' task clocks can be compared. rq->clock_task, the clock of both, is
/// rq->clock minus interrupt and steal time where the kernel accounts those per CPU; then two
/// CPUs' task clocks differ. And sched_clock, under both, must agree between CPUs: it does
/// where the kernel keeps a synchronised counter as its clocksource (it drops the TSC when it
/// finds it unstable).
fn task_clocks_agree(btf: &Btf) -> bool {
    field_path_offset(btf, "rq", &["prev_irq_time"]).is_err()
        && field_path_offset(btf, "rq", &["prev_steal_time_rq"]).is_err()
        && clocksource().is_some_and(|c| SYNCED_CLOCKSOURCES.contains(&c.as_str()))
}

/// The per-CPU offset of `this_cpu_off` (in `pcpu_hot` on 6.2-6.14), 0 where not found.
fn this_cpu_off(btf: &Btf, percpu: &HashMap<String, u64>) -> u64 {
    match percpu.get("this_cpu_off") {
        Some(o) => *o,
        None => percpu
            .get("pcpu_hot")
            .and_then(|o| Some(o + field_path_offset(btf, "pcpu_hot", &["this_cpu_off"]).ok()?))
            .unwrap_or(0),
    }
}

/// What `layout` found in the kernel: the offsets the programs are loaded with, and where
/// there is no context split, why.
#[derive(Clone, Debug)]
pub struct Layout {
    pub offsets: KernelLayout,
    /// Why calls cannot be told apart by context here (no per-CPU offsets), or None.
    pub no_context_split: Option<String>,
}

/// The offsets the eBPF programs need to read preempt_count and the task's off-CPU clock.
pub fn layout(btf: &Btf) -> Result<Layout> {
    // Without per-CPU offsets there is no preempt count to read: degrade to latency without
    // the context split (said in the header, the table and the JSON), never refuse to trace.
    let (percpu, percpu_from_kallsyms, no_context_split) = match percpu_vars(btf) {
        Ok((p, k)) => (p, k, None),
        Err(e) => (HashMap::new(), false, Some(e.to_string())),
    };
    let no_context = no_context_split.is_some();
    let arm64 = cfg!(target_arch = "aarch64");
    let mut offsets = KernelLayout {
        valid: 1,
        percpu_from_kallsyms: percpu_from_kallsyms as u64,
        no_context: no_context as u64,
        arch: if arm64 {
            memcg_trace_common::ARCH_ARM64
        } else {
            memcg_trace_common::ARCH_X86_64
        },
        // The loader sets `direct_preempt`, `direct_task`, `direct_untrusted` and
        // `direct_reads` once it has patched the programs (tracer::load_object): 0 here.
        ..KernelLayout::default()
    };

    context_offsets(btf, &percpu, no_context, arm64, &mut offsets)?;
    task_offsets(btf, no_context, &mut offsets)?;
    prog_offsets(btf, &mut offsets);
    cgroup_offsets(btf, &mut offsets);
    cast_offsets(btf, &percpu, &mut offsets);

    Ok(Layout {
        offsets,
        no_context_split,
    })
}

/// `layout`'s fields for a call's context: the preempt count (where, and its masks) and the
/// per-CPU variables read beside it.
fn context_offsets(
    btf: &Btf,
    percpu: &HashMap<String, u64>,
    no_context: bool,
    arm64: bool,
    o: &mut KernelLayout,
) -> Result<()> {
    let preempt = preempt_at(btf, percpu, no_context, arm64)?;
    o.runqueues = match percpu.get("runqueues") {
        Some(o) => *o,
        None if no_context => 0,
        None => bail!("per-CPU variable runqueues not found (BTF, kallsyms)"),
    };
    o.this_cpu_off = this_cpu_off(btf, percpu);
    o.preempt_member = preempt.member;
    o.preempt_count = preempt.offset;

    // The verifier finds the variable's address by name in kallsyms, where data symbols
    // are only with CONFIG_KALLSYMS_ALL (Debian has it; this sandbox's kernel does not).
    o.preempt_var_id = if !no_context && !arm64 && kallsyms_has(preempt.var) {
        var_id(btf, preempt.var).unwrap_or(0)
    } else {
        0
    };
    let (nmi_mask, hardirq_mask, softirq_offset) = PREEMPT_MASKS;
    o.nmi_mask = nmi_mask;
    o.hardirq_mask = hardirq_mask;
    o.softirq_offset = softirq_offset;
    o.interrupt_masks = (nmi_mask | hardirq_mask | softirq_offset) as u64;

    // Where the switch witness reads whether a BPF section is held (0: nowhere).
    o.prog_active = if no_context {
        0
    } else {
        percpu.get("bpf_prog_active").copied().unwrap_or(0)
    };
    o.percpu_start = if arm64 {
        kallsyms_addr("__per_cpu_start").unwrap_or(0)
    } else {
        0
    };
    Ok(())
}

/// `layout`'s fields of the task: its interrupt work, switch counts, off-CPU clock (see
/// memcg_trace_common::off_cpu), migrations, and the chase to its CPU's number (se.cfs_rq ->
/// rq -> cpu).
fn task_offsets(btf: &Btf, no_context: bool, o: &mut KernelLayout) -> Result<()> {
    (o.task_softirq, o.task_comm) = interrupt_work_in_tasks(btf, no_context)?;
    o.task_nvcsw = field_path_offset(btf, "task_struct", &["nvcsw"])?;
    o.task_nivcsw = field_path_offset(btf, "task_struct", &["nivcsw"])?;
    o.switches_adjacent = (o.task_nivcsw == o.task_nvcsw + 8) as u32;
    o.task_exec_start = field_path_offset(btf, "task_struct", &["se", "exec_start"])?;
    o.task_sum_exec = field_path_offset(btf, "task_struct", &["se", "sum_exec_runtime"])?;
    o.clock_adjacent = (o.task_sum_exec == o.task_exec_start + 8) as u32;
    o.task_migrations = field_path_offset(btf, "task_struct", &["se", "nr_migrations"])?;
    o.cross_cpu_clock = task_clocks_agree(btf) as u32;
    o.task_se_cfs_rq = field_path_offset(btf, "task_struct", &["se", "cfs_rq"])
        .context("task_struct.se.cfs_rq (needs CONFIG_FAIR_GROUP_SCHED)")?;
    o.cfs_rq_rq = field_path_offset(btf, "cfs_rq", &["rq"])?;
    o.rq_cpu = field_path_offset(btf, "rq", &["cpu"])?;
    Ok(())
}

/// `layout`'s fields of a BPF program: where it keeps its per-CPU recursion-miss counter
/// (0: not found; the fentry interrupt pairs are then confirmed in userspace instead).
fn prog_offsets(btf: &Btf, o: &mut KernelLayout) {
    let off = |s: &str, f: &str| field_path_offset(btf, s, &[f]).unwrap_or(0);
    o.prog_aux = off("bpf_prog", "aux");
    o.prog_stats = off("bpf_prog", "stats");
    o.prog_aux_id = off("bpf_prog_aux", "id");
    o.stats_misses = off("bpf_prog_stats", "misses");
}

/// `layout`'s fields for the cgroup chase: a task's cgroup id, a cgroup's ancestors.
fn cgroup_offsets(btf: &Btf, o: &mut KernelLayout) {
    let cgroup = cgroup_reads(btf);
    (o.task_cgroups, o.cset_dfl_cgrp, o.cgroup_kn, o.kn_id) = cgroup.id_path;
    o.direct_cgroup = (cgroup.id_path != (0, 0, 0, 0)) as u32;
    o.cgroup_level = field_path_offset(btf, "cgroup", &["level"]).unwrap_or(0);
    o.cgroup_ancestors = cgroup.ancestors.map_or(0, |a| a.0);
    o.ancestors_are_ids = cgroup.ancestors.is_some_and(|a| a.1) as u64;
}

/// `layout`'s fields for the typed reads through `bpf_rdonly_cast`: its kfunc and type ids,
/// and those of the current task's per-CPU pointer.
fn cast_offsets(btf: &Btf, percpu: &HashMap<String, u64>, o: &mut KernelLayout) {
    let cast = rdonly_cast_ids(btf);
    let task_cast = current_task_cast(btf, percpu, cast);
    o.cast_type_id = cast.map_or(0, |c| c.1);
    o.cast_kfunc_id = cast.map_or(0, |c| c.0);
    o.cast_u64_type_id = task_cast.map_or(0, |t| t.0);
    o.cast_task_type_id = task_cast.map_or(0, |t| t.1);
    o.current_task = task_cast.map_or(0, |t| t.2);
}

/// Whether the running kernel is a PREEMPT_RT build: its version string says so (`#1 SMP
/// PREEMPT_RT ...`, as `uname -v` shows it), as does `/sys/kernel/realtime` where it exists.
/// Read once: the preemption model asks at every tick.
pub fn realtime() -> bool {
    static RT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *RT.get_or_init(|| {
        fs::read_to_string("/sys/kernel/realtime").is_ok_and(|s| s.trim() == "1")
            || fs::read_to_string("/proc/sys/kernel/version")
                .is_ok_and(|v| v.split_whitespace().any(|w| w == "PREEMPT_RT"))
    })
}

/// Clocksources whose readings agree between CPUs (the kernel keeps the TSC only while it is).
const SYNCED_CLOCKSOURCES: &[&str] = &["tsc", "kvm-clock", "arch_sys_counter"];

/// The kernel's current clocksource.
pub fn clocksource() -> Option<String> {
    std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
        .ok()
        .map(|s| s.trim().to_string())
}

/// What this kernel leaves out of its task clock (`rq->clock_task`, under `se.exec_start`
/// and `se.sum_exec_runtime`): interrupt time with CONFIG_IRQ_TIME_ACCOUNTING (its BTF has
/// `rq.prev_irq_time`), steal time with CONFIG_PARAVIRT_TIME_ACCOUNTING
/// (`rq.prev_steal_time_rq`). The interrupts and steal on a CPU while a task is away from it
/// are then not in that task's time off the CPU as memcg-trace reads it: a lower bound
/// (Ubuntu's and Fedora's kernels; none of Debian's).
pub fn task_clock_excludes(btf: &Btf) -> Option<&'static str> {
    let irq = field_path_offset(btf, "rq", &["prev_irq_time"]).is_ok();
    let steal = field_path_offset(btf, "rq", &["prev_steal_time_rq"]).is_ok();
    match (irq, steal) {
        (true, true) => Some("interrupt and steal time"),
        (true, false) => Some("interrupt time"),
        (false, true) => Some("steal time"),
        (false, false) => None,
    }
}

/// How the programs tell a task call's time off the CPU on this kernel, in words for the
/// recording.
pub fn off_cpu_source(layout: &KernelLayout) -> String {
    let cs = clocksource().unwrap_or_else(|| "unknown".into());
    let migrated = if layout.cross_cpu_clock != 0 {
        format!("migrated calls too (the CPUs' task clocks agree; clocksource {cs})")
    } else {
        format!("migrated calls unknown (interrupt or steal time taken out of each CPU's task clock, or clocksource {cs} not known to be synchronised)")
    };
    format!("scheduler: se.exec_start - se.sum_exec_runtime after entry and at exit, for calls whose nvcsw + nivcsw moved; {migrated}")
}

/// What the programs read beyond the task and its CPU, by the features on.
#[derive(Debug, Clone, Copy, Default)]
pub struct Chased {
    /// The charged memcg: its argument and the pointers from it (`--by-memcg`, a workload told
    /// by its memcg).
    pub memcg: bool,
    /// The call site: the trampoline's frame or the stack's top word, and the code before a
    /// return address (`--callers`, with fentry or kprobe programs on x86_64).
    pub call_sites: bool,
}

/// How the loaded programs read the kernel (the layout as the loader left it), in words for
/// the recording: what every run costs depends on it.
pub fn reads_of(layout: &KernelLayout, tp_percpu: bool, chased: Chased) -> String {
    let cast = layout.direct_untrusted != 0;
    let preempt = if layout.arch == memcg_trace_common::ARCH_ARM64 {
        if cast {
            "preempt count from the running task's thread_info by a plain fault-safe load (bpf_rdonly_cast)"
        } else {
            "preempt count from the running task's thread_info by bpf_probe_read_kernel"
        }
    } else if layout.direct_preempt != 0 {
        "preempt count by bpf_this_cpu_ptr and a plain load"
    } else if cast {
        "preempt count by a plain fault-safe load (bpf_rdonly_cast)"
    } else {
        "preempt count by bpf_probe_read_kernel"
    };
    let task = if layout.direct_task == 0 {
        "task fields by bpf_probe_read_kernel"
    } else if cast && layout.current_task != 0 {
        "current task from its per-CPU pointer (bpf_rdonly_cast), its fields by plain loads"
    } else {
        "current task by bpf_get_current_task_btf, its fields by plain loads"
    };
    let hits = if tp_percpu {
        "; tracepoint hits counted per CPU"
    } else {
        ""
    };

    // One clause per thing chased, each saying how it is read.
    let how = if layout.direct_reads != 0 {
        "by plain fault-safe loads (bpf_rdonly_cast)"
    } else {
        "by bpf_probe_read_kernel"
    };
    let mut memcg = String::new();
    if chased.memcg {
        memcg.push_str(&format!("; the charged memcg {how}"));
    }

    // arm64's programs take the call site from a register (kprobe) or not at all (fentry).
    if chased.call_sites && layout.arch != memcg_trace_common::ARCH_ARM64 {
        memcg.push_str(&format!("; the call sites (fentry, kprobe) {how}"));
    }

    format!("{preempt}; {task}{memcg}{hits}")
}

/// Kernel build options that change what the charging path costs.
pub const CONFIG_OF_INTEREST: &[&str] = &[
    "CONFIG_PREEMPT",
    "CONFIG_PREEMPT_VOLUNTARY",
    "CONFIG_PREEMPT_NONE",
    "CONFIG_PREEMPT_DYNAMIC",
    "CONFIG_PREEMPT_RT",
    "CONFIG_PREEMPT_LAZY",
    "CONFIG_DEBUG_PREEMPT",
    "CONFIG_MEMCG",
    "CONFIG_MEMCG_KMEM",
    "CONFIG_SLUB_DEBUG",
    "CONFIG_SLUB_DEBUG_ON",
    "CONFIG_LOCKDEP",
    "CONFIG_PROVE_LOCKING",
    "CONFIG_KASAN",
    "CONFIG_DEBUG_VM",
    "CONFIG_HZ",
    "CONFIG_NR_CPUS",
];

/// The kernel's build configuration, from /proc/config.gz or /boot/config-<release>.
pub fn config(release: &str) -> Option<BTreeMap<String, String>> {
    let text = if let Ok(gz) = fs::read("/proc/config.gz") {
        let mut s = String::new();
        flate2::read::GzDecoder::new(&gz[..])
            .read_to_string(&mut s)
            .ok()?;
        s
    } else {
        fs::read_to_string(format!("/boot/config-{release}")).ok()?
    };
    Some(parse_config(&text))
}

/// The options of interest from a kernel .config text (`# X is not set` becomes "n").
pub fn parse_config(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let (k, v) = if let Some(rest) = line.strip_prefix("# ") {
            match rest.strip_suffix(" is not set") {
                Some(k) => (k, "n"),
                None => continue,
            }
        } else if let Some((k, v)) = line.split_once('=') {
            (k, v)
        } else {
            continue;
        };
        if CONFIG_OF_INTEREST.contains(&k) {
            out.insert(k.to_string(), v.trim_matches('"').to_string());
        }
    }
    out
}

/// The preemption model in the kernel's words: `PREEMPT_DYNAMIC, running as lazy` (the mode
/// /sys/kernel/debug/sched/preempt shows), `PREEMPT_DYNAMIC, booted as none` (the `preempt=`
/// boot option, else the built default, when debugfs is not there), or the build option of a
/// kernel without dynamic preemption (`PREEMPT_VOLUNTARY`, `PREEMPT (full)`, ...).
pub fn preemption_model(config: Option<&BTreeMap<String, String>>) -> String {
    let model = dynamic_or_built(config);

    // A PREEMPT_RT kernel with dynamic preemption (Debian's 6.12-rt) shows only full or lazy
    // in its model file: say RT first.
    if realtime() && !model.contains("PREEMPT_RT") {
        return format!("PREEMPT_RT, {model}");
    }
    model
}

fn dynamic_or_built(config: Option<&BTreeMap<String, String>>) -> String {
    for p in PREEMPT_FILES {
        if let Ok(s) = fs::read_to_string(p) {
            if let Some(cur) = s.split_whitespace().find(|w| w.starts_with('(')) {
                return format!(
                    "PREEMPT_DYNAMIC, running as {}",
                    cur.trim_matches(|c| c == '(' || c == ')')
                );
            }
        }
    }

    let cmdline = fs::read_to_string("/proc/cmdline").unwrap_or_default();
    let version = fs::read_to_string("/proc/sys/kernel/version").unwrap_or_default();
    model_from(config, &cmdline, &version)
}

/// Where a dynamic kernel's preemption model is set and shown.
const PREEMPT_FILES: [&str; 2] = [
    "/sys/kernel/debug/sched/preempt",
    "/sys/kernel/debug/sched_preempt",
];

/// Writes to a dynamic kernel's preemption model file, seen as they happen (inotify): a model
/// changed and changed back between two looks at the file would otherwise go unseen.
pub struct ModelWrites {
    fd: std::os::fd::OwnedFd,
}

impl ModelWrites {
    /// [`ModelWrites::watch`] where the preemption model (`kernel::preemption_model`) is
    /// dynamic and the programs were set for the one it runs as; else nothing to watch.
    pub fn watch_where_dynamic(model: &str) -> Option<ModelWrites> {
        model
            .contains("PREEMPT_DYNAMIC, running as")
            .then(ModelWrites::watch)
            .flatten()
    }

    /// Watches the model file, where there is one and inotify works on it.
    pub fn watch() -> Option<ModelWrites> {
        use std::os::fd::FromRawFd as _;

        // SAFETY: plain syscall; the descriptor is owned from here on.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if fd < 0 {
            return None;
        }

        // SAFETY: a descriptor just created and owned by nobody else.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        let file = PREEMPT_FILES.iter().find(|p| Path::new(p).exists())?;
        let path = std::ffi::CString::new(*file).ok()?;

        // SAFETY: a valid descriptor and a NUL-terminated path.
        let wd = unsafe {
            libc::inotify_add_watch(
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                path.as_ptr(),
                libc::IN_MODIFY,
            )
        };
        (wd >= 0).then_some(ModelWrites { fd })
    }

    /// Whether the file was written since the last call (the events are taken).
    pub fn written(&self) -> bool {
        let mut any = false;
        let mut buf = [0u8; 4096];
        loop {
            // SAFETY: reads into a buffer of the length given, from a descriptor we own.
            let got = unsafe {
                libc::read(
                    std::os::fd::AsRawFd::as_raw_fd(&self.fd),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                )
            };
            if got <= 0 {
                return any;
            }
            any = true;
        }
    }
}

/// The model from the build configuration and the kernel command line; without the
/// configuration, from the kernel's version string (`uname -v`, `version`), which names the
/// model where it preempts or is dynamic, one word (`PREEMPT` for full and lazy builds and for
/// dynamic ones before 5.18, `PREEMPT_DYNAMIC` from 5.18, `PREEMPT_RT`), and no model where it
/// does not. (`PREEMPT_LAZY` is taken too, should a build ever say it.)
pub fn model_from(
    config: Option<&BTreeMap<String, String>>,
    cmdline: &str,
    version: &str,
) -> String {
    let booted = || {
        cmdline
            .split_whitespace()
            .find_map(|w| w.strip_prefix("preempt="))
    };
    let Some(c) = config else {
        let words: Vec<&str> = version.split_whitespace().collect();
        let has = |w: &str| words.contains(&w);
        return if !words.first().is_some_and(|w| w.starts_with('#')) {
            "unknown"
        } else if has("PREEMPT_RT") {
            "PREEMPT_RT"
        } else if has("PREEMPT_DYNAMIC") {
            // The built default is not in the version string: a mode it cannot tell is
            // taken as preemptible (`preemptible`).
            return match booted() {
                Some(m) => format!("PREEMPT_DYNAMIC, booted as {m}"),
                None => "PREEMPT_DYNAMIC, mode unknown".into(),
            };
        } else if has("PREEMPT_LAZY") {
            "PREEMPT_LAZY"
        } else if has("PREEMPT") {
            "PREEMPT (full)"
        } else {
            "PREEMPT_NONE or PREEMPT_VOLUNTARY"
        }
        .into();
    };
    let on = |k: &str| c.get(k).map(|v| v == "y").unwrap_or(false);
    let built = if on("CONFIG_PREEMPT_RT") {
        "rt"
    } else if on("CONFIG_PREEMPT") {
        "full"
    } else if on("CONFIG_PREEMPT_LAZY") {
        "lazy"
    } else if on("CONFIG_PREEMPT_VOLUNTARY") {
        "voluntary"
    } else {
        "none"
    };
    if on("CONFIG_PREEMPT_DYNAMIC") {
        return format!("PREEMPT_DYNAMIC, booted as {}", booted().unwrap_or(built));
    }

    match built {
        "rt" => "PREEMPT_RT",
        "full" => "PREEMPT (full)",
        "lazy" => "PREEMPT_LAZY",
        "voluntary" => "PREEMPT_VOLUNTARY",
        _ => "PREEMPT_NONE",
    }
    .into()
}

/// A recording's preemption model in today's words: recordings made before memcg-trace said
/// "PREEMPT_DYNAMIC, booted as voluntary" said "dynamic voluntary" or "dynamic (built none)".
pub fn preemption_words(model: &str) -> String {
    match model.strip_prefix("dynamic ") {
        Some(rest) => {
            let rest = rest.trim_matches(|c| c == '(' || c == ')');
            match rest.strip_prefix("built ") {
                Some(built) => format!("PREEMPT_DYNAMIC, built as {built}"),
                None => format!("PREEMPT_DYNAMIC, booted as {rest}"),
            }
        }
        None => model.to_string(),
    }
}

/// Whether the kernel preempts tasks in kernel code, from the model as `preemption_model`
/// words it (full, lazy, RT, or a dynamic kernel running as one of those). There, fentry
/// programs can be preempted while they hold their recursion guard, and so can tasks holding a
/// CPU's kprobe guard in a map syscall. A model not known (no configuration, no version
/// string, or a dynamic kernel's mode not found) counts as preemptible: the programs then
/// assume runs can interleave, which is slower and never wrong.
pub fn preemptible(model: &str) -> bool {
    if model.starts_with("PREEMPT_RT") || model == "unknown" || model.ends_with("mode unknown") {
        return true;
    }

    let mode = model.rsplit_once(" as ").map(|(_, m)| m).unwrap_or(model);
    matches!(
        mode,
        "full" | "lazy" | "rt" | "PREEMPT_RT" | "PREEMPT (full)" | "PREEMPT_LAZY"
    )
}

/// The kernel's (major, minor) version from a release string like `6.12.117+deb12-amd64`.
pub fn version(release: &str) -> Option<(u32, u32)> {
    let mut it = release.split(|c: char| !c.is_ascii_digit());
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

/// Whether this kernel counts the runs of kprobe programs it skips for recursion in their
/// recursion misses (6.7+: "bpf: Count missed stats in trace_call_bpf").
pub fn kprobe_misses_counted() -> bool {
    version(&release()).is_some_and(|v| v >= (6, 7))
}

/// CPU model name and the number of online CPUs.
pub fn cpu_info() -> (String, usize) {
    let model = fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    (model, online_cpus())
}

/// Number of online CPUs (what the per-CPU maps hold values for).
pub fn online_cpus() -> usize {
    aya::util::online_cpus().map(|c| c.len()).unwrap_or(1)
}

/// preempt_count masks as `in_task()` uses them, and where they came from.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ContextMasks {
    /// NMI_MASK.
    pub nmi_mask: u32,
    /// HARDIRQ_MASK.
    pub hardirq_mask: u32,
    /// SOFTIRQ_OFFSET.
    pub softirq_offset: u32,
    /// "calibrated" (read from this kernel's preempt_count in known contexts), or
    /// "default (...)" with the reason calibration failed and the classic layout was used.
    pub source: String,
    /// How the NMI mask was found: "observed" (an NMI was seen during calibration) or
    /// "inferred" (from the hardirq field; no NMI was raised here); "none" without the split.
    #[serde(default = "inferred")]
    pub nmi: String,
    /// Where the per-CPU offsets (of the preempt count, the run queues) came from: "btf" (its
    /// `.data..percpu` section), "kallsyms" (kernels whose BTF has none, such as 5.10), or
    /// "none" (neither gave them: no context split, `source` says why).
    #[serde(default = "btf")]
    pub percpu: String,
    /// Where the softirq count is read: "preempt_count", or on PREEMPT_RT "task" (the running
    /// task's `softirq_disable_cnt`, where the kernel keeps it there).
    #[serde(default = "in_preempt_count")]
    pub softirq: String,
    /// Whether task-context calls of threaded interrupt handlers and softirq threads are
    /// counted apart (`irq_thread`, `softirq_thread` of the task rows): where threads do
    /// interrupt work (PREEMPT_RT, `threadirqs`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub threads: bool,
}

fn in_preempt_count() -> String {
    "preempt_count".into()
}

impl ContextMasks {
    /// Whether calls are told apart by context (the per-CPU offsets were found).
    pub fn split(&self) -> bool {
        self.percpu != "none"
    }

    /// How the softirq count is read, in words for the header: empty where it is the preempt
    /// count's.
    pub fn softirq_words(&self) -> &'static str {
        if self.softirq == "task" {
            " (softirq from the task's softirq_disable_cnt: PREEMPT_RT)"
        } else {
            ""
        }
    }
}

fn inferred() -> String {
    "inferred".into()
}

fn btf() -> String {
    "btf".into()
}

impl ContextMasks {
    /// The classic layout: softirq bits 8-15, hardirq 16-19, NMI 20-23. Used only when
    /// calibration failed, which is said loudly (header, JSON, `--strict`).
    pub fn classic(source: &str) -> Self {
        let (nmi_mask, hardirq_mask, softirq_offset) = PREEMPT_MASKS;
        ContextMasks {
            nmi_mask,
            hardirq_mask,
            softirq_offset,
            source: source.into(),
            nmi: inferred(),
            percpu: btf(),
            softirq: in_preempt_count(),
            threads: false,
        }
    }
}

/// Derives the masks from preempt_count values seen in known contexts: `softirq_all` and
/// `hardirq_all` are the bits set in every softirq_entry and every timer-interrupt hit,
/// `nmi_all` those set in every NMI seen (0: none seen). The serving-softirq bit is the lowest
/// one above the preemption byte; the hardirq field is the 4 bits from the lowest hardirq bit
/// above the softirq byte; the NMI field is the 4 bits above the hardirq field (as in every
/// layout so far), or, when an NMI was seen, the bits it set above the hardirq field.
///
/// Bits between the softirq byte and the hardirq field are not context: Debian 7.3 counts
/// hardirqs from bit 24 (timer interrupts carry 0x1000000), and the posted HARDIRQ_DISABLE
/// layout keeps a count of hardirq-disabled sections in bits 16-23, which task code carries.
pub fn derive_masks(softirq_all: u32, hardirq_all: u32, nmi_all: u32) -> Option<ContextMasks> {
    let soft = softirq_all & 0xff00;
    let hard = hardirq_all & 0x7fff_0000;
    if soft == 0 || hard == 0 {
        return None;
    }

    let softirq_offset = 1u32 << soft.trailing_zeros();
    let shift = hard.trailing_zeros();
    let hardirq_mask = (0xfu32 << shift) & 0x7fff_0000;
    let above = !((1u32 << (shift + 4)) - 1) & 0x7fff_ffff;
    let observed = nmi_all & above;
    let (nmi_mask, nmi) = if observed != 0 {
        // The field the NMI count lives in: 4 bits from the lowest bit an NMI set.
        (
            (0xfu32 << observed.trailing_zeros()) & 0x7fff_ffff,
            "observed",
        )
    } else {
        ((0xfu32 << (shift + 4)) & 0x7fff_ffff, "inferred")
    };
    Some(ContextMasks {
        nmi_mask,
        hardirq_mask,
        softirq_offset,
        source: "calibrated".into(),
        nmi: nmi.into(),
        percpu: btf(),
        softirq: in_preempt_count(),
        threads: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use memcg_trace_common::{classify, CTX_HARDIRQ, CTX_NMI, CTX_SOFTIRQ, CTX_TASK};

    #[test]
    fn per_cpu_offsets_come_from_kallsyms_where_btf_has_none() {
        // Lines as Debian 11's 5.10 lists them (the two offsets are the issue's); a module's
        // symbol of the same name, even absolute, and a text symbol after the area must not
        // count.
        let text = "0000000000000000 A fixed_percpu_data\n\
                    0000000000000000 A __per_cpu_start\n\
                    000000000001fb80 A __preempt_count\n\
                    0000000000033c40 A runqueues\n\
                    0000000000033d00 A this_cpu_off\t[fake]\n\
                    ffffffff81000000 T _stext\n\
                    ffffffff81000010 A current_task\n";
        let v = percpu_from_kallsyms(text.lines(), PERCPU_NAMES).unwrap();
        assert_eq!(v.get("__preempt_count"), Some(&0x1fb80));
        assert_eq!(v.get("runqueues"), Some(&0x33c40));
        assert_eq!(v.get("this_cpu_off"), None, "a module's symbol");
        assert_eq!(v.get("current_task"), None, "past the per-CPU area");

        // Relative to the area's start, wherever it is linked and wherever it is listed.
        let moved = "ffffffff82001000 A runqueues\nffffffff82000000 A __per_cpu_start\n";
        assert_eq!(
            percpu_from_kallsyms(moved.lines(), &["runqueues"]).unwrap()["runqueues"],
            0x1000
        );

        // kptr_restrict: every address reads 0.
        let hidden = "0000000000000000 A __per_cpu_start\n0000000000000000 A runqueues\n\
                      0000000000000000 T _stext\n";
        assert!(percpu_from_kallsyms(hidden.lines(), PERCPU_NAMES)
            .unwrap_err()
            .contains("kptr_restrict"));
        // A function of that name is not a per-CPU variable; without CONFIG_KALLSYMS_ALL none
        // is listed.
        let none = "ffffffff81000000 T runqueues\n";
        assert!(percpu_from_kallsyms(none.lines(), &["runqueues"])
            .unwrap_err()
            .contains("CONFIG_KALLSYMS_ALL"));
    }

    fn c(pc: u32, m: &ContextMasks) -> u32 {
        classify(pc, m.nmi_mask, m.hardirq_mask, m.softirq_offset)
    }

    #[test]
    fn classic_and_moved_layouts_are_derived_from_observed_bits() {
        // Observed in the VMs: 6.18 softirq_entry 0x102, timer 0x10000; 7.3 0x101, 0x1000001.
        let m618 = derive_masks(0x102, 0x10000, 0).unwrap();
        assert_eq!(
            (m618.softirq_offset, m618.hardirq_mask, m618.nmi_mask),
            (0x100, 0xf0000, 0xf00000),
            "the classic layout"
        );
        assert_eq!(m618.nmi, "inferred");
        let m73 = derive_masks(0x101, 0x100_0001, 0).unwrap();
        assert_eq!((m73.softirq_offset, m73.hardirq_mask), (0x100, 0xf00_0000));
        assert_eq!(
            m73.nmi_mask, 0x7000_0000,
            "NMI above hardirq, need-resched bit 31 excluded"
        );
        assert_eq!(c(0x100_0001, &m73), CTX_HARDIRQ);
        assert_eq!(c(0x101, &m73), CTX_SOFTIRQ);
        assert_eq!(
            c(0x201, &m73),
            CTX_TASK,
            "bottom halves disabled is still task"
        );
        assert_eq!(c(0x1000_0000 | 0x100_0000, &m73), CTX_NMI);
        assert_eq!(c(0x8000_0002, &m73), CTX_TASK, "need-resched bit ignored");
        assert!(
            derive_masks(0x2, 0x10000, 0).is_none(),
            "no softirq bit seen"
        );
        assert!(derive_masks(0x102, 0x3, 0).is_none(), "no hardirq bit seen");
    }

    /// The posted HARDIRQ_DISABLE layout: a count of hardirq-disabled sections in bits 16-23,
    /// hardirq from bit 24, NMI from 28. Task code inside spin_lock_irq_disable() carries the
    /// count; it is task context, not NMI.
    #[test]
    fn a_hardirq_disable_count_is_not_taken_for_nmi() {
        let masks = derive_masks(0x101, 0x100_0000, 0).unwrap();
        assert_eq!(
            c(0x1_0000, &masks),
            CTX_TASK,
            "task in a hardirq-disabled section"
        );
        assert_eq!(
            c(0x3_0000, &masks),
            CTX_TASK,
            "nested hardirq-disabled sections"
        );
        assert_eq!(
            c(0x1_0100, &masks),
            CTX_SOFTIRQ,
            "softirq in such a section"
        );
        assert_eq!(c(0x101_0000, &masks), CTX_HARDIRQ);
        assert_eq!(c(0x1100_0000, &masks), CTX_NMI);
    }

    #[test]
    fn an_observed_nmi_sets_the_nmi_field() {
        // An NMI on the classic layout carries NMI_OFFSET (bit 20) and HARDIRQ_OFFSET.
        let m = derive_masks(0x102, 0x10000, 0x110000).unwrap();
        assert_eq!((m.nmi_mask, m.nmi.as_str()), (0xf00000, "observed"));
        assert_eq!(c(0x110000, &m), CTX_NMI);
    }

    #[test]
    fn rt_softirq_is_read_from_the_task() {
        let m = ContextMasks::classic("test");
        let ctx = |pc: u32, task: u32| c(memcg_trace_common::rt_context_count(pc, task), &m);

        // Serving a softirq in a task (ksoftirqd, or bottom halves re-enabled): the task's
        // count has SOFTIRQ_OFFSET, preempt_count's softirq byte none.
        assert_eq!(ctx(0x0, 0x100), CTX_SOFTIRQ);

        // Bottom halves disabled inside the handler: still serving.
        assert_eq!(ctx(0x1, 0x300), CTX_SOFTIRQ);

        // Bottom halves disabled, not serving: task, as in_task() says.
        assert_eq!(ctx(0x0, 0x200), CTX_TASK);

        // A hardirq over a task serving a softirq is the hardirq's; an NMI the NMI's.
        assert_eq!(ctx(0x1_0000, 0x100), CTX_HARDIRQ);
        assert_eq!(ctx(0x10_0000, 0x100), CTX_NMI);

        // Whatever preempt_count's own softirq byte holds, the task's is the one read.
        assert_eq!(ctx(0x100, 0x0), CTX_TASK);

        // Only the softirq byte of the task's count counts.
        assert_eq!(ctx(0x0, 0x1_0000), CTX_TASK);
    }

    #[test]
    fn threads_that_do_interrupt_work_are_told_by_name() {
        use memcg_trace_common::{thread_kind_of, THREAD_IRQ, THREAD_OTHER, THREAD_SOFTIRQ};
        let kind = |comm: &str| {
            let b = comm.as_bytes();
            thread_kind_of(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        };
        assert_eq!(kind("irq/24-virtio0"), THREAD_IRQ);
        assert_eq!(kind("ksoftirqd/1"), THREAD_SOFTIRQ);
        assert_eq!(kind("ktimers/0"), THREAD_SOFTIRQ);
        assert_eq!(kind("hackbench"), THREAD_OTHER);
        assert_eq!(kind("irqbalance"), THREAD_OTHER);
    }

    #[test]
    fn preemptible_models() {
        for (model, want) in [
            ("PREEMPT_DYNAMIC, booted as full", true),
            ("PREEMPT_DYNAMIC, running as lazy", true),
            ("PREEMPT_DYNAMIC, booted as voluntary", false),
            ("PREEMPT_DYNAMIC, booted as none", false),
            ("PREEMPT (full)", true),
            ("PREEMPT_LAZY", true),
            ("PREEMPT_RT", true),
            ("PREEMPT_RT, PREEMPT_DYNAMIC, running as full", true),
            ("PREEMPT_RT, PREEMPT_DYNAMIC, booted as rt", true),
            ("PREEMPT_VOLUNTARY", false),
            ("PREEMPT_NONE", false),
            ("PREEMPT_NONE or PREEMPT_VOLUNTARY", false),
            ("PREEMPT_DYNAMIC, mode unknown", true),
            ("unknown", true),
        ] {
            assert_eq!(preemptible(model), want, "{model}");
        }

        assert_eq!(version("6.12.117+deb12-amd64"), Some((6, 12)));
        assert_eq!(version("7.3.4+deb13-amd64"), Some((7, 3)));
    }

    #[test]
    fn config_parsing_keeps_options_of_interest() {
        let config = parse_config("CONFIG_PREEMPT_VOLUNTARY=y\n# CONFIG_DEBUG_PREEMPT is not set\nCONFIG_HZ=250\nCONFIG_FOO=y\n");
        assert_eq!(config.get("CONFIG_PREEMPT_VOLUNTARY").unwrap(), "y");
        assert_eq!(config.get("CONFIG_DEBUG_PREEMPT").unwrap(), "n");
        assert_eq!(config.get("CONFIG_HZ").unwrap(), "250");
        assert!(!config.contains_key("CONFIG_FOO"));

        // The configuration wins over the version string.
        let version = "#1 SMP PREEMPT_DYNAMIC Debian 6.12.117-1 (2025-11-22)";
        assert_eq!(model_from(Some(&config), "", version), "PREEMPT_VOLUNTARY");
        let mut dynamic = config.clone();
        dynamic.insert("CONFIG_PREEMPT_DYNAMIC".into(), "y".into());
        assert_eq!(
            model_from(Some(&dynamic), "quiet", version),
            "PREEMPT_DYNAMIC, booted as voluntary"
        );
        assert_eq!(
            model_from(Some(&dynamic), "root=/dev/vda preempt=full", version),
            "PREEMPT_DYNAMIC, booted as full"
        );
    }

    #[test]
    fn preemption_model_without_the_configuration_comes_from_the_version_string() {
        for (version, cmdline, want, preempts) in [
            // Debian's 6.1 and 6.12: dynamic, the built default not said: preemptible unless
            // booted so.
            (
                "#1 SMP PREEMPT_DYNAMIC Debian 6.12.117-1 (2025-11-22)",
                "quiet",
                "PREEMPT_DYNAMIC, mode unknown",
                true,
            ),
            (
                "#1 SMP PREEMPT_DYNAMIC Debian 6.12.117-1 (2025-11-22)",
                "quiet preempt=none",
                "PREEMPT_DYNAMIC, booted as none",
                false,
            ),
            // Debian's 5.10 (voluntary, not dynamic): no model word.
            (
                "#1 SMP Debian 5.10.244-1 (2025-09-29)",
                "",
                "PREEMPT_NONE or PREEMPT_VOLUNTARY",
                false,
            ),
            ("#1 SMP PREEMPT Tue Mar 3 2026", "", "PREEMPT (full)", true),
            (
                "#1 SMP PREEMPT_RT Debian 6.12.117-1",
                "",
                "PREEMPT_RT",
                true,
            ),
            (
                "#1 SMP PREEMPT_LAZY Sun Jan 4 2026",
                "",
                "PREEMPT_LAZY",
                true,
            ),
            // No version string at all.
            ("", "", "unknown", true),
        ] {
            let model = model_from(None, cmdline, version);
            assert_eq!(model, want, "{version:?} {cmdline:?}");
            assert_eq!(preemptible(&model), preempts, "{model}");
        }
    }

    #[test]
    fn old_preemption_wording_is_said_in_todays_words() {
        assert_eq!(
            preemption_words("dynamic voluntary"),
            "PREEMPT_DYNAMIC, booted as voluntary"
        );
        assert_eq!(
            preemption_words("dynamic (built none)"),
            "PREEMPT_DYNAMIC, built as none"
        );
        for today in [
            "PREEMPT_DYNAMIC, booted as none",
            "PREEMPT_DYNAMIC, running as lazy",
            "PREEMPT_LAZY",
            "PREEMPT (full)",
            "PREEMPT_VOLUNTARY",
        ] {
            assert_eq!(preemption_words(today), today);
        }
    }

    #[test]
    fn kallsyms_separates_clones() {
        let mut syms = Symbols::default();
        let text = "ffffffff81000000 T obj_cgroup_charge\nffffffff81000010 t mod_memcg_state.constprop.0\nffffffff82000000 D some_data\nffffffff81000020 T other\n";
        syms.add_kallsyms(text, None);
        assert!(syms.kallsyms.contains("obj_cgroup_charge"));
        assert!(!syms.kallsyms.contains("some_data"));
        assert_eq!(
            syms.clones["mod_memcg_state"],
            vec!["mod_memcg_state.constprop.0"]
        );
    }
}
