//! Reading the programs' maps once a tick into a snapshot: histograms, counters, the
//! breakdowns by call site and memcg, the deferred pairs settled, the programs' costs.

use super::*;

/// The kernel's run count, run time and recursion misses of a program: from its
/// `bpf_prog_info`, else (kernels whose info lacks them) from its fdinfo.
pub(super) fn program_cost(name: &str, fd: &OwnedFd) -> ProgCost {
    let (run_time_ns, run_cnt, recursion_misses) = proginfo::stats(fd.as_fd())
        .or_else(|| fdinfo_stats(fd))
        .unwrap_or_default();
    ProgCost {
        name: name.to_string(),
        run_time_ns,
        run_cnt,
        recursion_misses,
    }
}

/// `run_time_ns`, `run_cnt` and `recursion_misses` of a program from its fdinfo (what it
/// lacks reads 0).
pub(super) fn fdinfo_stats(fd: &OwnedFd) -> Option<(u64, u64, u64)> {
    let info = fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())).ok()?;
    let mut out = (0, 0, 0);
    for line in info.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let v: u64 = v.trim().parse().unwrap_or(0);
        match k {
            "run_time_ns" => out.0 = v,
            "run_cnt" => out.1 = v,
            "recursion_misses" => out.2 = v,
            _ => {}
        }
    }
    Some(out)
}

/// A breakdown map of the programs (`CALLERS`, `MEMCGS`) and the slots in front of it.
pub(super) struct Breakdown<K> {
    /// The map, read through the map syscalls (a hash map cannot be mapped).
    pub map: aya::maps::HashMap<MapData, K, CallerStat>,
    /// The slots in front of it (see `FrontSlot`), mapped, and the shards they are laid out
    /// for; None with the legacy object, which leaves them empty.
    pub front: Option<(Shared<FrontSlot>, u32)>,
}

impl<K: aya::Pod> Breakdown<K> {
    /// The map `name` and its front slots `front` of the loaded object, when `wanted`.
    pub(super) fn take(
        ebpf: &mut Ebpf,
        name: &str,
        front: &str,
        wanted: bool,
        sizes: FrontSizes,
    ) -> Result<Option<Self>> {
        if !wanted {
            return Ok(None);
        }

        let front = match sizes.entries(wanted) {
            1 => None,
            entries => {
                let m = ebpf
                    .map(front)
                    .ok_or_else(|| anyhow!("map {front} missing"))?;
                Some((Shared::new(front, m, entries as usize)?, sizes.shards))
            }
        };
        let m = ebpf
            .take_map(name)
            .ok_or_else(|| anyhow!("map {name} missing"))?;
        Ok(Some(Breakdown {
            map: aya::maps::HashMap::try_from(m).with_context(|| format!("map {name}"))?,
            front,
        }))
    }

    /// Every (probe slot, context, id) counted, with its calls: the front slots' and the map's
    /// (`key` gives a map key's triple), each id's slots and entries of every shard added up.
    pub(super) fn rows(
        &self,
        key: impl Fn(&K) -> (u32, u32, u64),
    ) -> HashMap<(u32, u32, u64), CallerStat> {
        let mut by: HashMap<(u32, u32, u64), CallerStat> = HashMap::new();
        let mut add = |at: (u32, u32, u64), v: &CallerStat| {
            let s = by.entry(at).or_default();
            s.count += v.count;
            s.sum_ns += v.sum_ns;
            for (a, b) in s.buckets.iter_mut().zip(v.buckets.iter()) {
                *a += b;
            }
        };
        if let Some((front, shards)) = &self.front {
            for i in 0..front.entries() {
                // Most slots are free: their tag alone is read.
                if front.first_word(i) == 0 {
                    continue;
                }

                let slot = front.get(i);

                // A slot just claimed, its first call not yet added, is no row yet.
                if slot.tag == 0 || slot.stat.count == 0 {
                    continue;
                }

                let (probe, ctx) = memcg_trace_common::front_region(i as u32, *shards);
                add((probe, ctx, slot.tag - 1), &slot.stat);
            }
        }

        for (k, v) in self.map.iter().flatten() {
            add(key(&k), &v);
        }
        by
    }
}

/// A breakdown of the calls (call sites, charged memcgs) by (probe slot, context, id): what the
/// kernel counted (`Breakdown::rows`), with the calls userspace confirmed added.
pub(super) fn breakdown<K: aya::Pod>(
    b: &Breakdown<K>,
    key: impl Fn(&K) -> (u32, u32, u64),
    confirmed: Option<&crate::callers::Confirmed>,
    probes: u32,
) -> HashMap<(u32, u32, u64), crate::callers::Site> {
    use crate::callers::Site;
    let mut by: HashMap<(u32, u32, u64), Site> = HashMap::new();
    for ((probe, ctx, id), v) in b.rows(key) {
        let s = by
            .entry((probe, ctx, id))
            .or_insert_with(|| Site::new(ctx, id));
        s.count += v.count;
        s.sum_ns += v.sum_ns;
        for (a, b) in s.buckets.iter_mut().zip(v.buckets.iter()) {
            *a += b;
        }
    }

    if let Some(c) = confirmed {
        for slot in 0..probes {
            for site in c.of(slot) {
                by.entry((slot, site.ctx, site.addr))
                    .or_insert_with(|| Site::new(site.ctx, site.addr))
                    .merge(site);
            }
        }
    }
    by
}

/// A breakdown's rows by probe slot, each named by `name` of its id.
fn by_probe(
    by: HashMap<(u32, u32, u64), crate::callers::Site>,
    name: impl Fn(u64) -> String,
) -> HashMap<u32, Vec<crate::callers::Site>> {
    let mut out: HashMap<u32, Vec<crate::callers::Site>> = HashMap::new();
    for ((probe, _, _), mut site) in by {
        site.name = name(site.addr);
        out.entry(probe).or_default().push(site);
    }
    out
}

impl Tracer {
    /// Every call site's calls by probe slot, the kernel's and the confirmed ones, named, the
    /// costliest first. Read through the map syscalls, which keep kprobe programs on the
    /// reading CPU from running meanwhile (their misses are counted): only with `--callers`,
    /// once a tick, a few microseconds per site.
    pub(super) fn sites(&mut self) -> HashMap<u32, Vec<crate::callers::Site>> {
        let Some(m) = &self.callers else {
            return HashMap::new();
        };
        let by = breakdown(
            m,
            |k| (k.probe, u32::from(k.ctx), k.caller),
            self.verifier.callers.as_ref(),
            self.probes,
        );
        self.names.resolve(by.keys().map(|k| k.2));
        let mut out = by_probe(by, |a| self.names.name(a));
        for v in out.values_mut() {
            v.sort_by(|a, b| b.sum_ns.cmp(&a.sum_ns).then(a.addr.cmp(&b.addr)));
        }
        out
    }

    /// The sampled short stacks by probe slot, named, the most sampled first: the tracer's own
    /// frames left out (see `crate::callers::strip_tracer_frames`), `stack_shown` frames
    /// kept, stacks that became one merged.
    fn stack_rows(&mut self) -> HashMap<u32, Vec<crate::callers::Stack>> {
        use crate::callers::Stack;
        let mut by: HashMap<(u32, u32, Vec<u64>), Stack> = HashMap::new();
        let Some(m) = &self.stacks else {
            return HashMap::new();
        };
        let all: Vec<(StackKey, u64)> = m.iter().flatten().collect();
        self.names.resolve(all.iter().flat_map(|(k, _)| k.frames));
        for (k, count) in all {
            let raw: Vec<(u64, String)> = k
                .frames
                .iter()
                .copied()
                .take_while(|f| *f != 0)
                .map(|f| {
                    let n = if f == memcg_trace_common::STACK_UNWOUND {
                        "(not unwound)".to_string()
                    } else {
                        self.names.name(f)
                    };
                    (f, n)
                })
                .collect();
            let mut kept = crate::callers::strip_tracer_frames(raw);
            kept.truncate(self.stack_shown as usize);
            let (frames, names): (Vec<u64>, Vec<String>) = kept.into_iter().unzip();
            by.entry((k.probe, k.ctx, frames.clone()))
                .or_insert_with(|| Stack {
                    ctx: k.ctx,
                    frames,
                    names,
                    count: 0,
                })
                .count += count;
        }

        let mut out: HashMap<u32, Vec<Stack>> = HashMap::new();
        for ((probe, _, _), stack) in by {
            out.entry(probe).or_default().push(stack);
        }

        for v in out.values_mut() {
            v.sort_by(|a, b| b.count.cmp(&a.count).then(a.frames.cmp(&b.frames)));
        }
        out
    }

    /// Every charged memcg's calls by probe slot, the kernel's and the confirmed ones, named by
    /// cgroup path, the costliest (counts only: the most called) first. Read through the map
    /// syscalls, as the call sites are: only with `--by-memcg`, once a tick.
    fn memcg_rows(&mut self) -> HashMap<u32, Vec<crate::callers::Site>> {
        let Some(m) = &self.memcgs else {
            return HashMap::new();
        };
        let by = breakdown(
            m,
            |k| (k.probe, u32::from(k.ctx), k.memcg),
            self.verifier.memcgs.as_ref(),
            self.probes,
        );
        self.memcg_names.resolve(by.keys().map(|k| k.2));
        let mut out = by_probe(by, |id| self.memcg_names.name(id));
        for v in out.values_mut() {
            v.sort_by(|a, b| {
                (b.sum_ns, b.count)
                    .cmp(&(a.sum_ns, a.count))
                    .then(a.addr.cmp(&b.addr))
                    .then(a.ctx.cmp(&b.ctx))
            });
        }
        out
    }

    /// Takes in the deferred pairs and confirms those that can be.
    fn settle_deferred(&mut self) {
        for slot in 0..self.attached.len() {
            self.mark(slot);
        }

        while let Some(item) = self.ring.next() {
            if item.len() >= std::mem::size_of::<Deferred>() {
                // SAFETY: the programs write whole Deferred records; read unaligned.
                let d = unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<Deferred>()) };
                self.verifier.push(d);
            }
        }

        self.verifier.settle();
    }

    /// The kernel's statistics of one program of the object.
    pub(super) fn cost(&self, prog: &str) -> ProgCost {
        match self.prog_fds.get(prog) {
            Some(fd) => program_cost(prog, fd),
            None => ProgCost {
                name: prog.to_string(),
                ..Default::default()
            },
        }
    }

    /// The code of one attached program of the object, as the kernel runs it.
    pub fn code(&self, prog: &str) -> Option<proginfo::ProgCode> {
        proginfo::code(self.prog_fds.get(prog)?.as_fd()).ok()
    }

    /// Forwards the programs' diagnostics, if they are on.
    pub fn flush_log(&mut self) {
        if let Some(l) = self.logger.as_mut() {
            l.flush();
        }
    }

    /// Time since the first probe was attached: the clock of every snapshot's `elapsed`.
    pub fn elapsed(&self) -> std::time::Duration {
        self.started.elapsed()
    }

    /// Detaches every program, then takes the final snapshot: no run is left uncounted between
    /// the read of the maps and the read of the run statistics, and every deferred pair is
    /// decided.
    pub fn finish(&mut self) -> Result<Snapshot> {
        let elapsed = self.started.elapsed();
        self.ended = Some(Instant::now());
        self.detach_all();
        self.flush_log();
        let mut snap = self.snapshot()?;
        snap.elapsed = elapsed;
        snap.pending = self.pending_calls();
        Ok(snap)
    }

    /// Calls still pending in the programs' slots, per probe slot (after detaching: no
    /// program runs any more): the slots' keys, read from the mapping.
    fn pending_calls(&self) -> Vec<u64> {
        let mut out = vec![0; self.attached.len()];
        for cpu in 0..self.cpus {
            for (slot, n) in out.iter_mut().enumerate() {
                *n += (0..memcg_trace_common::PENDING_SLOTS)
                    .filter(|&call| self.states.word(cpu, state_offsets::key(slot, call)) != 0)
                    .count() as u64;
            }
        }
        out
    }

    /// Reads what the programs counted, summed over CPUs, with the deferred pairs confirmed so
    /// far.
    pub fn snapshot(&mut self) -> Result<Snapshot> {
        self.settle_deferred();
        self.update_workload_memcgs();
        let mut sites = self.sites();
        let mut memcgs = self.memcg_rows();
        let mut stacks = self.stack_rows();
        let mut probes = Vec::with_capacity(self.attached.len());

        // The kernel's kprobe counts before the programs' (see `kprobe_profiles`); the cells;
        // then the CPUs' states, whose entries, read after the cells' exits, are not fewer (a
        // call's entry is counted before its exit; on x86, which does not reorder loads; no
        // figure subtracts the two).
        let profiles: Vec<_> = self
            .attached
            .iter()
            .map(|a| self.kprobe_profiles(a))
            .collect();
        let mut read: Vec<_> = self
            .attached
            .iter()
            .map(|a| self.read_contexts(a))
            .collect();
        for (a, (contexts, _)) in self.attached.iter().zip(read.iter_mut()) {
            self.add_state_counts(a, contexts);
        }

        for ((a, profiles), (contexts, workload_read)) in
            self.attached.iter().zip(profiles).zip(read)
        {
            let workload = self.workload.then(|| {
                let mut hist = HistData::default();
                if a.backend.has_latency() {
                    hist = workload_read.clone();
                    hist.merge(&self.verifier.workload[a.slot as usize]);
                } else {
                    // Counts only, kept next to the hits (in every context where the workload
                    // is told by its memcg).
                    hist.count = contexts.iter().map(|c| c.counters.workload_hits).sum();
                }
                hist
            });
            let (kprobe_missed, kprobe_skipped) = kprobe_losses(&profiles, &contexts);
            probes.push(ProbeStats {
                workload,
                name: a.name.clone(),
                target: a.target.clone(),
                backend: a.backend,
                contexts,
                programs: a.programs.iter().map(|p| self.cost(p)).collect(),
                kprobe_missed,
                kprobe_skipped,
                held_switches: self
                    .witness
                    .as_ref()
                    .is_some_and(|w| w.slots.contains(&a.slot))
                    .then(|| self.held_total()),
                window: Some(
                    self.ended
                        .unwrap_or_else(Instant::now)
                        .saturating_duration_since(a.opened),
                ),
                callers: sites.remove(&a.slot).unwrap_or_default(),
                memcgs: memcgs.remove(&a.slot).unwrap_or_default(),
                stacks: stacks.remove(&a.slot).unwrap_or_default(),
                stack_sample: self.stack_sample,
            });
        }
        Ok(Snapshot {
            elapsed: self.started.elapsed(),
            probes,
            extra: self.extra.iter().map(|p| self.cost(p)).collect(),
            waiting: self.verifier.waiting() as u64,
            pending: Vec::new(),
            bpf_stats: self.stats.is_some(),
            no_context_split: self.no_context_split,
        })
    }

    /// The kernel's counts of probe `a`'s kprobe events: (kretprobe, hits, misses). Read
    /// before the programs' counters, so that a hit counted here has run (or was skipped)
    /// before they are read: hits less runs never exceeds the runs skipped (exact once the
    /// probes are detached).
    fn kprobe_profiles(&self, a: &Attached) -> Vec<(bool, u64, u64)> {
        a.programs
            .iter()
            .filter_map(|p| match self.kprobes.get(p) {
                Some(k) => k.profile().map(|(hits, missed)| (k.ret, hits, missed)),
                None => self.kprobes_closed.get(p).copied(),
            })
            .collect()
    }

    /// Probe `a`'s counts kept in the CPUs' states, added to its contexts: the entries of a
    /// probe with an exit (`PendingSet::entries`), the hits of a tracepoint counting per CPU
    /// (`CpuState::tp_hits`). Read field by field from the mapping (no syscall, and not the
    /// whole state: 31 KB a CPU).
    fn add_state_counts(&self, a: &Attached, contexts: &mut [CtxStats; NUM_CTX]) {
        let slot = a.slot as usize;
        let latency = a.backend.has_latency();
        if !latency && !self.tp_percpu {
            return;
        }
        for (ctx, stats) in contexts.iter_mut().enumerate() {
            for cpu in 0..self.cpus {
                if latency {
                    stats.counters.entries +=
                        self.states.word(cpu, state_offsets::entries(slot, ctx));
                } else {
                    let cell = (slot * NUM_CTX + ctx) & (TP_CELLS - 1);
                    stats.counters.entries +=
                        self.states.word(cpu, state_offsets::tp_hits(cell, 0));
                    stats.counters.workload_hits +=
                        self.states.word(cpu, state_offsets::tp_hits(cell, 1));
                }
            }
        }
    }

    /// Probe `a`'s figures by context, summed over CPUs, with the pairs confirmed in
    /// userspace; and its workload's calls from the very same reads. Without the counts kept
    /// in the per-CPU states (`add_state_counts`).
    fn read_contexts(&self, a: &Attached) -> ([CtxStats; NUM_CTX], HistData) {
        let mut contexts: [CtxStats; NUM_CTX] = Default::default();

        // The programs time a workload's call, and count its exit, in its workload cell
        // only (one record per call; its entry is counted in the context's cell); the
        // context's figures hold both. The task context only, unless the workload is told
        // by the memcg charged.
        let wc = self.workload_contexts;
        let workload_cells = |cpu: u32, ctx: u32| {
            (a.backend.has_latency() && (ctx == CTX_TASK || wc > 1))
                .then(|| workload_cell(cpu, self.probes, a.slot, ctx, wc) as usize)
        };

        // The workload's row from the very reads that go into the contexts, so that it
        // never holds calls they do not (the maps change while read).
        let mut workload_read = HistData::default();
        for (ctx, stats) in contexts.iter_mut().enumerate() {
            for cpu in 0..self.cpus as u32 {
                let i = cell(cpu, self.probes, a.slot, ctx as u32) as usize;
                let ctx_cell = self.cells.get(i);
                stats.hist.add_cpu(&ctx_cell.hist);
                stats.counters.add(&ctx_cell.counters);
                if let Some(w) = workload_cells(cpu, ctx as u32) {
                    let c = self.workload_cells.get(w);
                    stats.hist.add_cpu(&c.hist);
                    stats.counters.add(&c.counters);
                    workload_read.add_cpu(&c.hist);
                }
            }

            let out = &self.verifier.outcomes[a.slot as usize][ctx];
            stats.hist.merge(&out.hist);
            stats.confirmed = out.hist.count;
            stats.rejected = out.rejected;
            stats.unproven_nested_ns = out.unproven_nested_ns;

            // The snapshot's off-CPU figures cover every timed call: the kernel's and the
            // confirmed ones.
            let c = &mut stats.counters;
            c.off_cpu_ns += out.off_cpu_ns;
            c.off_cpu_max_ns = c.off_cpu_max_ns.max(out.off_cpu_max_ns);
            c.off_cpu_unknown += out.off_cpu_unknown;
            c.self_unknown += out.self_unknown;
            c.outermost_ns += out.outermost_ns;

            // Where the task clock leaves out interrupt and steal time, every call that
            // left the CPU (and whose time off it is not unknown anyway) has only a lower
            // bound of it.
            stats.off_cpu_at_least = if self.task_clock_excludes.is_some() {
                stats
                    .counters
                    .switched
                    .saturating_sub(stats.counters.off_cpu_unknown)
            } else {
                0
            };
        }
        (contexts, workload_read)
    }
}

/// A probe's kprobe losses, from the kernel's event counts (`profiles`) and the programs'
/// runs (`contexts`): (kprobe misses, calls both of whose programs were skipped at most).
fn kprobe_losses(profiles: &[(bool, u64, u64)], contexts: &[CtxStats; NUM_CTX]) -> (u64, u64) {
    // A kprobe and a kretprobe on one function are one aggregated kprobe to the
    // kernel: a hit it cannot handle (another kprobe running on that CPU) is a miss of
    // both events, for one call neither program sees. The kretprobe's own misses
    // beyond that (no free instance) are calls whose entry ran: already lost.
    let kprobe_missed = profiles.iter().filter(|p| !p.0).map(|p| p.2).sum();

    // Every run of an entry program counts one entry (or an entry whose context or
    // state could not be read), every run of an exit program one exit.
    let runs = |exit: bool| -> u64 {
        contexts
            .iter()
            .map(|c| {
                let c = &c.counters;
                if exit {
                    c.exits + c.no_context_exits
                } else {
                    c.entries + c.no_context_entries
                }
            })
            .sum()
    };

    // Runs skipped at entry and at exit, per side; a call counted nowhere had both
    // skipped (one skipped at one side only is an orphan exit or a stale entry, lost):
    // at most the fewer of the two.
    let skipped = |ret: bool| -> Option<u64> {
        profiles
            .iter()
            .filter(|p| p.0 == ret)
            .map(|&(_, hits, _)| hits.saturating_sub(runs(ret)))
            .reduce(|a, b| a + b)
    };
    let skipped_both = match (skipped(false), skipped(true)) {
        (Some(a), Some(b)) => a.min(b),
        (a, b) => a.or(b).unwrap_or(0),
    };
    (kprobe_missed, skipped_both)
}

/// Byte offsets in a `CpuState` of the words userspace reads from the mapping.
mod state_offsets {
    use std::mem::{offset_of, size_of};

    use memcg_trace_common::{
        CpuState, Pending, PendingSet, MAX_PROBES, NUM_CTX, PENDING_SLOTS, TP_CELLS,
    };

    /// Probe slot `slot`'s pending set.
    fn set(slot: usize) -> usize {
        assert!(slot < MAX_PROBES, "probe slot {slot} beyond {MAX_PROBES}");
        offset_of!(CpuState, pending) + slot * size_of::<PendingSet>()
    }

    /// `pending[slot].entries[ctx]`.
    pub(super) fn entries(slot: usize, ctx: usize) -> usize {
        assert!(ctx < NUM_CTX, "context {ctx} beyond {NUM_CTX}");
        set(slot) + offset_of!(PendingSet, entries) + ctx * size_of::<u64>()
    }

    /// `pending[slot].calls[call].key`.
    pub(super) fn key(slot: usize, call: usize) -> usize {
        assert!(
            call < PENDING_SLOTS,
            "call slot {call} beyond {PENDING_SLOTS}"
        );
        set(slot)
            + offset_of!(PendingSet, calls)
            + call * size_of::<Pending>()
            + offset_of!(Pending, key)
    }

    /// `tp_hits[cell][which]`.
    pub(super) fn tp_hits(cell: usize, which: usize) -> usize {
        assert!(
            cell < TP_CELLS && which < 2,
            "tracepoint cell {cell}/{which} out of range"
        );
        offset_of!(CpuState, tp_hits) + (cell * 2 + which) * size_of::<u64>()
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        /// Each offset reads the field it names out of a state's bytes (and no other: every
        /// field written holds a value of its own).
        #[test]
        fn offsets_read_the_fields_they_name() {
            // SAFETY: CpuState is a plain struct of integers: all zeros is a value of it.
            let mut st: Box<CpuState> = Box::new(unsafe { std::mem::zeroed() });
            let mut v = 1;
            for slot in 0..MAX_PROBES {
                for ctx in 0..NUM_CTX {
                    st.pending[slot].entries[ctx] = v;
                    v += 1;
                }
                for call in 0..PENDING_SLOTS {
                    st.pending[slot].calls[call].key = v;
                    v += 1;
                }
            }
            for cell in 0..TP_CELLS {
                st.tp_hits[cell] = [v, v + 1];
                v += 2;
            }
            let word = |offset: usize| {
                // SAFETY: an offset within the state (the functions assert their indices; the
                // read is checked against its size here), aligned to 8 as the fields are.
                assert!(offset + 8 <= size_of::<CpuState>() && offset.is_multiple_of(8));
                unsafe {
                    (&*st as *const CpuState as *const u8)
                        .add(offset)
                        .cast::<u64>()
                        .read()
                }
            };
            for slot in 0..MAX_PROBES {
                for ctx in 0..NUM_CTX {
                    assert_eq!(word(entries(slot, ctx)), st.pending[slot].entries[ctx]);
                }
                for call in 0..PENDING_SLOTS {
                    assert_eq!(word(key(slot, call)), st.pending[slot].calls[call].key);
                }
            }
            for cell in 0..TP_CELLS {
                assert_eq!(word(tp_hits(cell, 0)), st.tp_hits[cell][0]);
                assert_eq!(word(tp_hits(cell, 1)), st.tp_hits[cell][1]);
            }
        }
    }
}
