//! The maps the programs share with userspace and among themselves.

use crate::*;

/// Counters and histogram by (CPU, probe, context); each CPU writes its own region, userspace
/// maps the array and sums the regions. Sized by userspace at load.
#[map]
pub(crate) static CELLS: Array<Cell> = Array::with_max_entries(1, BPF_F_MMAPABLE);

/// The workload's calls by (CPU, probe[, context]) (see `workload_cell`), timed and their exits
/// counted there instead of in CELLS (see `Cell`).
#[map]
pub(crate) static WORKLOAD_CELLS: Array<Cell> = Array::with_max_entries(1, BPF_F_MMAPABLE);

/// Deferred pairs for userspace to confirm. Sized by userspace at load.
#[map]
pub(crate) static DEFERRED: RingBuf = RingBuf::with_byte_size(1 << 20, 0);

/// Each CPU's state, by CPU number (sized by userspace to the possible CPUs): its number and
/// the address of its preempt count, found once and verified; its nesting sums; the calls
/// waiting for their exit and the entries counted. Mappable, so that userspace reads the
/// entries every tick without a map syscall (which would hold its CPU's `bpf_prog_active` and
/// make the kprobe programs there miss runs; see `tracer::shared`). Only the programs of CPU
/// `i` write element `i`, but for the exit of a call that migrated, run on another CPU: it
/// claims its slot by compare-and-swap and clears its `used` bit, or takes it from the
/// evicted ones (`search_cpu`).
#[map]
pub(crate) static CPU_STATE: Array<CpuState> = Array::with_max_entries(1, BPF_F_MMAPABLE);

/// Per probe slot: WINDOW_OPEN while both programs of the slot are attached (set by userspace).
#[map]
pub(crate) static WINDOW: Array<u64> = Array::with_max_entries(MAX_PROBES as u32, 0);

/// Timed calls per call site (`--callers`), sized by userspace: 1 entry when off.
#[map]
pub(crate) static CALLERS: HashMap<CallerKey, CallerStat> = HashMap::with_max_entries(1, 0);

/// Calls per charged memcg (`--by-memcg`), sized by userspace: 1 entry when off.
#[map]
pub(crate) static MEMCGS: HashMap<MemcgKey, CallerStat> = HashMap::with_max_entries(1, 0);

/// The slots in front of `CALLERS` (see `FrontSlot`), sized by userspace: 1 entry when off.
#[map]
pub(crate) static CALLER_FRONT: Array<FrontSlot> = Array::with_max_entries(1, BPF_F_MMAPABLE);

/// The slots in front of `MEMCGS` (see `FrontSlot`), sized by userspace: 1 entry when off.
#[map]
pub(crate) static MEMCG_FRONT: Array<FrontSlot> = Array::with_max_entries(1, BPF_F_MMAPABLE);

/// Per probe slot: how to reach the charged memcg from the first argument (set by userspace
/// when the probe is attached).
#[map]
pub(crate) static MEMCG_PATH: Array<MemcgPath> = Array::with_max_entries(MAX_PROBES as u32, 0);

/// Whether a memcg is the workload's (`Config::workload_memcg`; `names::MAP_WORKLOAD_MEMCGS`):
/// `MEMCG_IN_WORKLOAD` for its subtree (userspace, each tick) and the verdicts of the climbs
/// (`memcg_in_workload`); sized 1 when unused.
#[map]
pub(crate) static WORKLOAD_MEMCGS: LruHashMap<u64, u8> = LruHashMap::with_max_entries(1, 0);

/// The workload's memcg id, where a climb stops (written by userspace before any call counts).
#[map]
pub(crate) static WORKLOAD_ROOT: Array<u64> = Array::with_max_entries(1, 0);

/// Sampled short stacks (`--callers-depth`): entries per stack, sized by userspace: 1 entry
/// when off.
#[map]
pub(crate) static STACKS: HashMap<StackKey, u64> = HashMap::with_max_entries(1, 0);

/// One zeroed `CallerStat`: the value a new call site starts from (too large for the stack).
#[map]
pub(crate) static CALLER_ZERO: Array<CallerStat> = Array::with_max_entries(1, 0);

/// Per probe slot: the per-CPU address of the fentry program's recursion-miss counter (its
/// `prog->stats` plus the offset of `misses`), filled in by userspace before the program is
/// attached; 0 when unknown.
#[map]
pub(crate) static PROG_MISSES: Array<u64> = Array::with_max_entries(MAX_PROBES as u32, 0);
