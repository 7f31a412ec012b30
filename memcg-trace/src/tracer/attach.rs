//! Attaching a probe's programs to the kernel function or tracepoint it resolved to, and
//! detaching them; the switch witness; the workload's memcg.

use super::*;

/// What a slot was readied with before its programs are attached (`Tracer::prepare_slot`).
struct Prepared {
    /// The struct of the argument the charged memcg is read from, when it is read.
    memcg_arg: Option<String>,
    /// The switch witness proves the slot's deferred pairs.
    witnessed: bool,
}

impl Tracer {
    /// Attaches `req` by the first plan that loads and attaches; records why others failed.
    pub fn attach(&mut self, req: &Request, res: &Resolution) -> bool {
        let slot = self.attached.len() as u32;
        let name = req.name();
        let mut reasons = res.notes.clone();
        if slot >= self.probes {
            reasons.push(format!("more than {} probes requested", self.probes));
            self.failed.push(NotAttached { name, reasons });
            return false;
        }

        for plan in &res.plans {
            // Two probes on one function (`--all` on 7.x, where `charge` resolves to the slab
            // hook that `slab_post_alloc` is) would count each call twice and nest each in the
            // other: not this plan.
            if let Some(a) = self
                .attached
                .iter()
                .find(|a| same_function(&a.target, &plan.target))
            {
                reasons.push(format!(
                    "{}: {} is already traced as {}: its calls are there",
                    plan.backend, plan.target, a.name
                ));
                continue;
            }

            let programs = slot_programs(plan.backend, slot, self.fentry_build);
            let prepared = self.prepare_slot(slot, plan, &mut reasons);

            // The entry program is new: its misses are 0 until it is attached; the switch
            // witness's count is read before then too.
            let before = monotonic_ns();
            let held_before = if prepared.witnessed {
                self.held_total()
            } else {
                0
            };
            let read = monotonic_ns();
            match self.attach_programs(&programs, &plan.target, Some(slot)) {
                Ok(()) => {
                    let mark = Mark {
                        before,
                        misses: held_before,
                        after: read,
                    };
                    self.open_slot(slot, plan.backend, programs[0], prepared.witnessed, mark);
                    self.attached.push(Attached {
                        slot,
                        name,
                        target: plan.target.clone(),
                        backend: plan.backend,
                        notes: reasons,
                        programs,
                        memcg_arg: prepared.memcg_arg,
                        opened: Instant::now(),
                    });
                    if self.attached.len() == 1 {
                        self.started = Instant::now();
                    }

                    self.mark(slot as usize);
                    return true;
                }
                Err(e) => reasons.push(format!("{}: {}: {e}", plan.backend, plan.target)),
            }
        }

        if res.plans.is_empty() && reasons.is_empty() {
            reasons.push("no backend can attach it".into());
        }

        self.failed.push(NotAttached { name, reasons });
        false
    }

    /// Readies probe slot `slot` for `plan`'s programs, before they run: a call never reads
    /// another target's path, nor another program's count of missed runs (a plan that failed
    /// here may have pointed it at its own: the exits would prove calls against a count of the
    /// wrong program); a kprobe whose deferred pairs the kernel's miss counts cannot prove
    /// gets the switch witness, which runs before its programs do.
    fn prepare_slot(&mut self, slot: u32, plan: &Plan, reasons: &mut Vec<String>) -> Prepared {
        let memcg_arg = self.set_memcg_path(slot, plan);
        self.set_prog_misses(slot, 0);
        let witnessed = plan.backend == Backend::Kprobe
            && self.kprobe_defers
            && !crate::kernel::kprobe_misses_counted()
            && self.start_witness(reasons);
        Prepared {
            memcg_arg,
            witnessed,
        }
    }

    /// Opens the window of slot `slot`, whose programs (`entry` the entry program, of
    /// `backend`) were just attached: its calls count from here, its deferred pairs are
    /// checked from `mark` on, and how they can be proven is set.
    fn open_slot(
        &mut self,
        slot: u32,
        backend: Backend,
        entry: &'static str,
        witnessed: bool,
        mark: Mark,
    ) {
        self.set_window(slot, memcg_trace_common::WINDOW_OPEN);
        self.verifier.mark(slot as usize, mark);

        // Deferred pairs of a kprobe can be confirmed where the kernel counts kprobe programs'
        // recursion misses (6.7+), or by the switch witness; fentry's always can.
        if witnessed {
            if let Some(w) = self.witness.as_mut() {
                w.slots.push(slot);
            }
        }

        self.verifier.set_verifiable(
            slot as usize,
            backend != Backend::Kprobe || crate::kernel::kprobe_misses_counted() || witnessed,
        );

        // The kprobe entry program's missed runs per CPU, so that its exits prove the calls
        // that left the CPU without moving off it (fentry's were pointed at before it ran).
        // Entries made before then are not proven there, only deferred.
        if backend == Backend::Kprobe && self.kprobe_defers {
            if crate::kernel::kprobe_misses_counted() {
                self.point_prog_misses(entry, slot);
            } else if witnessed {
                self.set_prog_misses(slot, memcg_trace_common::MISSES_BY_WITNESS);
            }
        }
    }

    /// Attaches `programs` (entry first) to `target`, exits first: an entry whose exit is not
    /// there yet would only leave stale pending calls. All or none. `slot`: the probe slot they
    /// serve (None for the bench's floors, which have no pairing state).
    pub(super) fn attach_programs(
        &mut self,
        programs: &[&'static str],
        target: &str,
        slot: Option<u32>,
    ) -> Result<(), String> {
        for (i, &name) in programs.iter().enumerate().rev() {
            let r = self.attach_program(name, target, slot);
            if let Err(e) = r {
                if let Some(p) = self.ebpf.program_mut(name) {
                    unload(p);
                }

                for &done in &programs[i + 1..] {
                    self.detach(done);
                }

                return Err(e);
            }
        }
        Ok(())
    }

    fn attach_program(
        &mut self,
        name: &'static str,
        target: &str,
        slot: Option<u32>,
    ) -> Result<(), String> {
        // fentry: loaded first, so that its own miss counter goes to PROG_MISSES before it runs.
        let fentry = matches!(self.ebpf.program(name), Some(Program::FEntry(_)));
        if fentry {
            let btf = self
                .btf
                .as_ref()
                .ok_or("attaching is over (BTF released)")?;
            let Some(Program::FEntry(f)) = self.ebpf.program_mut(name) else {
                return Err(format!("program {name} missing from the object"));
            };
            f.load(target, btf).map_err(|e| chain(&e))?;
            if let Some(slot) = slot {
                self.point_prog_misses(name, slot);
            }
        }

        let btf = self
            .btf
            .as_ref()
            .ok_or("attaching is over (BTF released)")?;
        let p = self
            .ebpf
            .program_mut(name)
            .ok_or_else(|| format!("program {name} missing from the object"))?;
        let k = load_and_attach(p, name, target, btf)?;
        if let Some(fd) = dup_fd(p) {
            self.prog_fds.insert(name, fd);
        }

        if let Some(k) = k {
            self.kprobes.insert(name, k);
        }
        Ok(())
    }

    /// Points PROG_MISSES[slot] at the per-CPU recursion-miss counter of the loaded entry
    /// program `name` (found with the `bpf_prog` iterator); leaves it 0 when that cannot be
    /// done.
    fn point_prog_misses(&mut self, name: &str, slot: u32) {
        let addr = (|| -> Result<u64> {
            let id = match self.ebpf.program(name) {
                Some(Program::FEntry(p)) => p.info()?.id(),
                Some(Program::KProbe(p)) => p.info()?.id(),
                _ => bail!("not an fentry or kprobe program"),
            };
            let stats = checks::prog_stats(&mut self.ebpf, self.btf.as_ref())?
                .remove(&id)
                .ok_or_else(|| anyhow!("program {id} not listed by the iterator"))?;
            Ok(stats + self.misses_offset)
        })();
        let addr = match addr {
            _ if self.misses_unreachable.is_some() => {
                let why = self.misses_unreachable.clone().unwrap_or_default();
                self.notes_once(why);
                0
            }
            Ok(a) if self.misses_offset != 0 => a,
            Ok(_) => {
                self.notes_once("struct bpf_prog_stats has no misses field in BTF".into());
                0
            }
            Err(e) => {
                self.notes_once(format!("{e:#}"));
                0
            }
        };
        self.set_prog_misses(slot, addr);
    }

    /// Sets PROG_MISSES[slot] (see `memcg_trace_common::Pending::misses`).
    fn set_prog_misses(&mut self, slot: u32, value: u64) {
        if let Some(m) = self.ebpf.map_mut(names::MAP_PROG_MISSES) {
            if let Ok(mut a) = aya::maps::Array::<_, u64>::try_from(m) {
                let _ = a.set(slot, value, 0);
            }
        }
    }

    /// Tells slot `slot`'s programs how to reach the charged memcg of `plan`'s target (from
    /// `memcg_paths`; none: the memcg is not read); returns the argument's struct when there
    /// is a path.
    fn set_memcg_path(&mut self, slot: u32, plan: &Plan) -> Option<String> {
        let key = (plan.backend == Backend::Tracepoint, plan.target.clone());
        let (arg, path) = match self.memcg_paths.get(&key) {
            Some((arg, path)) => (Some(arg.clone()), *path),
            None => (None, MemcgPath::default()),
        };
        let m = self.ebpf.map_mut(names::MAP_MEMCG_PATH)?;
        let mut a = aya::maps::Array::<_, MemcgPath>::try_from(m).ok()?;
        a.set(slot, path, 0).ok()?;
        arg
    }

    /// Tells the workload's calls by the memcg at `dir` (and those below it): fills the set
    /// the programs look the charged memcg up in. Kept up to date at each snapshot.
    pub fn set_workload_memcg(&mut self, dir: &std::path::Path) -> Result<()> {
        let map = self
            .ebpf
            .take_map(names::MAP_WORKLOAD_MEMCGS)
            .ok_or_else(|| anyhow!("map {} missing", names::MAP_WORKLOAD_MEMCGS))?;
        let set = aya::maps::HashMap::try_from(map).context("the workload's memcgs")?;

        // Where the programs' climbs stop, before the set is filled: a memcg made below it
        // meanwhile is found there.
        let root = crate::memcgs::id_of(dir)
            .ok_or_else(|| anyhow!("the workload's memcg {} is gone", dir.display()))?;
        let m = self
            .ebpf
            .map_mut(names::MAP_WORKLOAD_ROOT)
            .ok_or_else(|| anyhow!("map {} missing", names::MAP_WORKLOAD_ROOT))?;
        aya::maps::Array::<_, u64>::try_from(m)
            .and_then(|mut a| a.set(0, root, 0))
            .context("the workload's memcg id")?;
        self.workload_memcg = Some((dir.to_path_buf(), set, Default::default()));
        self.update_workload_memcgs();
        Ok(())
    }

    /// Adds the ids of cgroups created below the workload's memcg since the last call. Only
    /// those not put in yet, known without asking the map: a map system call holds its CPU's
    /// bpf_prog_active, and if the daemon is switched out meanwhile every kprobe program on
    /// that CPU is skipped and the switch witness rejects the deferred calls in flight (seen on
    /// 6.1-rt under reclaim, `--cgroup`: 69 of 230 rejected when a lookup ran every tick). A
    /// tick that finds no new cgroup makes no system call here.
    pub(super) fn update_workload_memcgs(&mut self) {
        if let Some((dir, set, known)) = self.workload_memcg.as_mut() {
            for id in crate::memcgs::subtree_ids(dir) {
                if !known.contains(&id) && set.insert(id, MEMCG_IN_WORKLOAD, 0).is_ok() {
                    known.insert(id);
                }
            }
        }
    }

    /// Records, once, why fentry interrupt pairs are confirmed in userspace instead of in the
    /// kernel.
    fn notes_once(&mut self, why: String) {
        if self.calibration.is_empty() {
            self.calibration.push(format!(
                "fentry interrupt pairs confirmed per tick in userspace (coarser): the programs' own miss counters are not readable: {why}"
            ));
        }
    }

    /// Detaches one program.
    pub(super) fn detach(&mut self, name: &'static str) {
        if let Some(k) = self.kprobes.remove(name) {
            let ret = k.ret;
            if let Some((hits, missed)) = k.close() {
                self.kprobes_closed.insert(name, (ret, hits, missed));
            }
        }

        if let Some(p) = self.ebpf.program_mut(name) {
            unload(p);
        }
    }

    /// Detaches the programs of a probe slot, entry first: calls already in flight still get
    /// their exit.
    pub fn detach_slot(&mut self, slot: u32) {
        let progs: Vec<&'static str> = self
            .attached
            .iter()
            .filter(|a| a.slot == slot)
            .flat_map(|a| a.programs.clone())
            .collect();
        for p in progs {
            self.detach(p);
        }
    }

    /// Attaches further programs of the object (the bench floors) to `plan`'s target, exit
    /// programs first; their costs are reported in [`Snapshot::extra`].
    pub fn attach_extra(&mut self, programs: &[&'static str], plan: &Plan) -> Result<()> {
        self.attach_programs(programs, &plan.target, None)
            .map_err(|e| anyhow!("{} on {}: {e}", programs.join("+"), plan.target))?;
        self.extra.extend_from_slice(programs);
        Ok(())
    }

    /// Frees the cut-down kernel BTF once every probe is attached; later attaches fail. With short
    /// stacks, the kernel's symbols are copied again (call while privileged): now they hold
    /// the BPF trampolines attaching made, which stacks pass through.
    pub fn done_attaching(&mut self) {
        self.btf = None;

        // A switch witness whose kprobe could not be attached after all costs every context
        // switch for nothing.
        if self.witness.as_ref().is_some_and(|w| w.slots.is_empty()) {
            self.detach(names::HELD_SWITCH);
            self.extra.retain(|p| *p != names::HELD_SWITCH);
            self.witness = None;
        }

        if self.stacks.is_some() {
            let (n, _) = crate::callers::Names::new();
            self.names = n;
        }
    }

    /// Opens or closes the tracing window of a slot (see `memcg_trace_common::Counters::outside`).
    fn set_window(&mut self, slot: u32, state: u64) {
        if let Some(m) = self.ebpf.map_mut(names::MAP_WINDOW) {
            if let Ok(mut a) = aya::maps::Array::<_, u64>::try_from(m) {
                let _ = a.set(slot, state, 0);
            }
        }
    }

    /// Detaches every program (also done on drop): every probe's entry program first, then the
    /// exits, so that calls in flight end paired.
    pub fn detach_all(&mut self) {
        for slot in 0..self.attached.len() as u32 {
            self.set_window(slot, 0);
        }

        let mut progs: Vec<&'static str> = self
            .attached
            .iter()
            .filter_map(|a| a.programs.first().copied())
            .collect();
        progs.extend(
            self.attached
                .iter()
                .flat_map(|a| a.programs.iter().skip(1).copied()),
        );
        progs.extend(self.extra.iter().copied());
        for p in progs {
            self.detach(p);
        }
    }

    /// Attaches the switch witness unless it is on already; false (and why, in `reasons`)
    /// where it cannot be: the deferred pairs are then all rejected, as unproven.
    fn start_witness(&mut self, reasons: &mut Vec<String>) -> bool {
        if self.witness.is_some() {
            return true;
        }

        if !self.prog_active_known {
            reasons.push(
                "kprobe: calls that left the CPU cannot be proven on this kernel (it counts no kprobe program misses before 6.7, and bpf_prog_active, which the switch witness reads, is not a known per-CPU variable): they are counted unproven".into(),
            );
            return false;
        }

        match self.attach_program(names::HELD_SWITCH, names::HELD_SWITCH_TARGET, None) {
            Ok(()) => {
                self.extra.push(names::HELD_SWITCH);
                self.witness = Some(Witness { slots: Vec::new() });
                true
            }
            Err(e) => {
                reasons.push(format!(
                    "kprobe: calls that left the CPU cannot be proven on this kernel (it counts no kprobe program misses before 6.7, and the switch witness could not be attached to {}: {e}): they are counted unproven",
                    names::HELD_SWITCH_TARGET
                ));
                false
            }
        }
    }

    /// Switches that found a BPF section held, on every CPU so far.
    pub(super) fn held_total(&self) -> u64 {
        (0..self.cpus)
            .map(|cpu| self.held_switches.get(cpu).held)
            .sum()
    }

    /// A reading of a probe's entry program misses, for the verifier.
    pub(super) fn mark(&mut self, slot: usize) {
        let Some(a) = self.attached.iter().find(|a| a.slot as usize == slot) else {
            return;
        };
        let Some(fd) = a.programs.first().and_then(|p| self.prog_fds.get(p)) else {
            return;
        };
        let witnessed = self
            .witness
            .as_ref()
            .is_some_and(|w| w.slots.contains(&(slot as u32)));
        let before = monotonic_ns();
        let mut misses = program_cost("", fd).recursion_misses;
        if witnessed {
            misses += self.held_total();
        }

        let after = monotonic_ns();
        self.verifier.mark(
            slot,
            Mark {
                before,
                misses,
                after,
            },
        );
    }
}
