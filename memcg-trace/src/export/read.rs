//! Recordings read back: checked (sizes, numbers JSON cannot hold exactly), upgraded from
//! schema memcg-trace/1, and turned into a snapshot for the outputs.

use super::*;

/// Reads a recording (schema memcg-trace/2 or /1), with one clear error for each way a file can
/// be wrong.
pub fn read(path: &Path) -> Result<Document> {
    let text =
        fs::read_to_string(path).map_err(|e| anyhow!("cannot read {}: {e}", path.display()))?;
    parse(&text).map_err(|e| anyhow!("{}: {e}", path.display()))
}

/// Parses a recording from its text.
pub fn parse(text: &str) -> Result<Document> {
    let json: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| anyhow!("not a memcg-trace recording (invalid JSON: {e})"))?;
    let schema = match json.get("schema").and_then(|s| s.as_str()) {
        Some(s @ (SCHEMA | SCHEMA_V1)) => s.to_string(),
        Some(other) => {
            return Err(anyhow!(
                "schema {other} is not supported (expected {SCHEMA} or {SCHEMA_V1})"
            ))
        }
        None => return Err(anyhow!("not a memcg-trace recording (no \"schema\")")),
    };
    check_numbers(&json, &mut String::new())?;
    let mut doc: Document =
        serde_json::from_value(json).map_err(|e| anyhow!("malformed {schema} document: {e}"))?;
    check_sizes(&doc)?;
    if schema == SCHEMA_V1 {
        upgrade_v1(&mut doc);
    }

    wall_shares(&mut doc);
    Ok(doc)
}

/// Recordings made before `wall_share` existed held the wall share in `cpu_share`: it moves
/// there, and the on-CPU share is not known.
fn wall_shares(doc: &mut Document) {
    for p in doc.probes.iter_mut() {
        for c in p.contexts.iter_mut() {
            if let Some(l) = c.latency.as_mut().filter(|l| l.wall_share.is_none()) {
                l.wall_share = l.cpu_share.take();
            }
        }
    }
}

/// Refuses shapes no recording has: more probes, programs, contexts or buckets than memcg-trace
/// writes, or a histogram whose buckets add up beyond [`MAX_COUNT`]. With [`check_numbers`],
/// this bounds every sum a reader makes (merging a probe's histograms, adding up probes).
fn check_sizes(doc: &Document) -> Result<()> {
    let at_most = |what: &str, n: usize, max: usize| {
        if n > max {
            Err(anyhow!("{n} {what}: no recording has more than {max}"))
        } else {
            Ok(())
        }
    };
    at_most("probes", doc.probes.len(), 64)?;
    for p in &doc.probes {
        at_most("programs in a probe", p.programs.len(), 16)?;
        at_most("contexts in a probe", p.contexts.len(), NUM_CTX)?;
        let lats = p
            .contexts
            .iter()
            .filter_map(|c| c.latency.as_ref())
            .chain(p.workload.as_ref().and_then(|w| w.latency.as_ref()));
        for l in lats {
            at_most("buckets in a histogram", l.buckets.len(), NUM_BUCKETS)?;
            let total: u128 = l.buckets.iter().map(|b| b.count as u128).sum();
            if total > MAX_COUNT as u128 {
                return Err(anyhow!(
                    "probe {}: its histogram's buckets add up to {total}, beyond any real recording (above 2^53)",
                    p.name
                ));
            }
        }
    }
    Ok(())
}

/// The largest count a recording may hold (2^53: JSON readers keep integers exact up to it, and
/// no run makes that many calls), and the largest time in ns (2^56, over two years). Bounded
/// so, with [`check_sizes`], the sums every reader makes cannot overflow.
const MAX_COUNT: u64 = 1 << 53;

const MAX_NS: u64 = 1 << 56;

/// Refuses integers no recording holds, naming where: counts above [`MAX_COUNT`], durations
/// (`*_ns` members) above [`MAX_NS`].
fn check_numbers(v: &serde_json::Value, at: &mut String) -> Result<()> {
    use serde_json::Value;
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                let len = at.len();
                at.push('/');
                at.push_str(k);

                // Points in time (`*_unix_ns`) are never added up.
                if let Some(n) = x.as_u64().filter(|_| !k.ends_with("_unix_ns")) {
                    let (limit, what) = if k.ends_with("_ns") {
                        (MAX_NS, "2^56 ns")
                    } else {
                        (MAX_COUNT, "2^53")
                    };
                    if n > limit {
                        return Err(anyhow!(
                            "{n} at {at} is beyond any real recording (above {what})"
                        ));
                    }
                }

                check_numbers(x, at)?;
                at.truncate(len);
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                let len = at.len();
                at.push_str(&format!("/{i}"));
                if let Some(n) = x.as_u64() {
                    if n > MAX_COUNT {
                        return Err(anyhow!(
                            "{n} at {at} is beyond any real recording (above 2^53)"
                        ));
                    }
                }

                check_numbers(x, at)?;
                at.truncate(len);
            }
        }
        _ => {}
    }
    Ok(())
}

/// memcg-trace/1 dropped the task-context calls that left the CPU (its `switched`) and called
/// exits without entry `unmatched`; in /2 terms those calls are lost, not timed.
fn upgrade_v1(doc: &mut Document) {
    for p in &mut doc.probes {
        for c in &mut p.contexts {
            c.rejected += c.switched;
            c.switched = 0;
            c.lost = c.orphans + c.no_context_exits + c.rejected;
            c.exits = c.count + c.lost;
            c.paired = c.count;
        }

        p.lost = p.contexts.iter().map(|c| c.lost).sum();
    }

    doc.schema = SCHEMA.into();
    doc.upgraded_from = Some(SCHEMA_V1.into());
}

/// The `Snapshot` a recording describes, so that the dashboard shows recordings exactly as it
/// shows live data (`memcg-trace view`). Contexts are matched by name.
pub fn to_snapshot(doc: &Document) -> Snapshot {
    Snapshot {
        elapsed: Duration::from_nanos(doc.meta.duration_ns),
        probes: doc.probes.iter().map(probe_stats).collect(),
        extra: Vec::new(),
        waiting: 0,
        pending: doc.probes.iter().map(|p| p.pending_at_end).collect(),
        bpf_stats: doc.meta.bpf_stats,
        no_context_split: doc.meta.context_masks.as_ref().is_some_and(|m| !m.split()),
    }
}

/// A histogram of `count` calls from a recorded latency (none: the calls only).
fn hist_data(count: u64, l: Option<&Latency>) -> HistData {
    let mut hist = HistData {
        count,
        ..Default::default()
    };
    if let Some(l) = l {
        hist.sum_ns = l.sum_ns;
        hist.self_ns = l.self_ns.unwrap_or(l.sum_ns);
        hist.nested = l.nested_calls.unwrap_or(0);
        hist.off_ns = l.off_cpu_ns.unwrap_or(0);
        hist.nested_off_ns = l.nested_off_cpu_ns.unwrap_or(0);
        hist.min_ns = l.min_ns;
        hist.max_ns = l.max_ns;
        for b in &l.buckets {
            let c = &mut hist.buckets[bucket_index(b.min_ns)];
            *c = c.saturating_add(b.count);
        }
    }
    hist
}

/// One probe of a recording as the tracer's statistics.
fn probe_stats(p: &ProbeOut) -> ProbeStats {
    ProbeStats {
        name: p.name.clone(),
        target: p.target.clone(),
        backend: p.backend,
        contexts: contexts_of(p),
        programs: p
            .programs
            .iter()
            .map(|x| ProgCost {
                name: x.name.clone(),
                run_cnt: x.run_cnt,
                run_time_ns: x.run_time_ns,
                recursion_misses: x.recursion_misses,
            })
            .collect(),
        workload: p
            .workload
            .as_ref()
            .map(|w| hist_data(w.count, w.latency.as_ref())),
        kprobe_missed: p.kprobe_missed,
        kprobe_skipped: p.kprobe_skipped,
        held_switches: p.held_switches,
        window: p.window_ns.map(Duration::from_nanos),
        callers: p
            .callers
            .iter()
            .map(|c| {
                let addr = u64::from_str_radix(c.address.trim_start_matches("0x"), 16).unwrap_or(0);
                site(&c.context, addr, &c.site, c.calls, c.sum_ns, &c.buckets)
            })
            .collect(),
        memcgs: p
            .memcgs
            .iter()
            .map(|m| site(&m.context, m.id, &m.cgroup, m.calls, m.sum_ns, &m.buckets))
            .collect(),
        stacks: p
            .stacks
            .iter()
            .map(|s| crate::callers::Stack {
                ctx: kernel::ctx_index(&s.context).unwrap_or(0) as u32,
                frames: s
                    .addresses
                    .iter()
                    .map(|a| u64::from_str_radix(a.trim_start_matches("0x"), 16).unwrap_or(0))
                    .collect(),
                names: s.frames.clone(),
                count: s.sampled,
            })
            .collect(),
        stack_sample: p.stack_sample.unwrap_or(1),
    }
}

/// A probe's statistics per context, from its recorded context rows.
fn contexts_of(p: &ProbeOut) -> [CtxStats; NUM_CTX] {
    let mut contexts: [CtxStats; NUM_CTX] = Default::default();
    for c in &p.contexts {
        let Some(i) = kernel::ctx_index(&c.context) else {
            continue;
        };
        let timed = p.backend.has_latency();
        contexts[i] = CtxStats {
            hist: hist_data(if timed { c.count } else { 0 }, c.latency.as_ref()),
            counters: Counters {
                entries: if timed { c.entries } else { c.count },
                // Recordings from before self time count every call as unknown.
                self_unknown: match c.latency.as_ref().map(|l| l.self_ns) {
                    Some(None) => c.count,
                    _ => c.self_unknown,
                },
                // Kept for the tracepoint backend's task context; the recording has it as the
                // workload's count.
                workload_hits: match (&p.workload, timed, i) {
                    (Some(w), false, 0) => w.count,
                    _ => 0,
                },
                ..counters_of(c)
            },
            confirmed: c.confirmed,
            rejected: c.rejected,
            unproven_nested_ns: c.unproven_nested_ns,
            off_cpu_at_least: c.off_cpu_at_least,
        };
    }
    contexts
}

/// A call site's or a memcg's row (`key`: its address or id) as the tracer's breakdown entry.
fn site(
    context: &str,
    key: u64,
    name: &str,
    calls: u64,
    sum_ns: u64,
    buckets: &[[u64; 2]],
) -> crate::callers::Site {
    let ctx = kernel::ctx_index(context).unwrap_or(0) as u32;
    let mut entry = crate::callers::Site::new(ctx, key);
    entry.name = name.to_owned();
    entry.count = calls;
    entry.sum_ns = sum_ns;
    for [i, n] in buckets {
        if let Some(b) = entry.buckets.get_mut(*i as usize) {
            *b = *n;
        }
    }
    entry
}
