use super::*;

#[test]
fn a_clone_is_its_function() {
    assert!(same_function(
        "__memcg_slab_post_alloc_hook",
        "__memcg_slab_post_alloc_hook"
    ));
    assert!(same_function(
        "__mod_memcg_state.part.0",
        "__mod_memcg_state"
    ));
    assert!(!same_function("mod_memcg_state", "__mod_memcg_state"));
    assert!(!same_function(
        "obj_cgroup_charge",
        "obj_cgroup_charge_account"
    ));
}

/// The legacy object below 5.19 (where bpf_map_lookup_percpu_elem came), direct task reads from 5.11
/// (bpf_get_current_task_btf); an unknown version takes the full object.
#[test]
fn object_and_reads_by_kernel_version() {
    assert_eq!(Object::for_kernel(Some((5, 10))), Object::Legacy);
    assert_eq!(Object::for_kernel(Some((5, 18))), Object::Legacy);
    assert_eq!(Object::for_kernel(Some((5, 19))), Object::Full);
    assert_eq!(Object::for_kernel(Some((6, 1))), Object::Full);
    assert_eq!(Object::for_kernel(None), Object::Full);
    assert!(needs_probe_read(Some((5, 10))));
    assert!(!needs_probe_read(Some((5, 11))));
    assert!(!needs_probe_read(None));

    // The legacy object leaves the migrated-call search (a bpf_loop callback) out.
    let has = |o: &[u8], s: &[u8]| o.windows(s.len()).any(|w| w == s);
    if !EBPF_OBJECT.is_empty() {
        assert!(has(EBPF_OBJECT, b"search_cpu"));
        assert!(!has(EBPF_LEGACY, b"search_cpu"));
        assert!(has(EBPF_LEGACY, b"fexit_lean_0"));
        assert!(has(EBPF_LEGACY, b"fexit_patched_0"));
    }
}

/// Every probe slot's programs are one code: linked with their subprograms (as the loader
/// links them), slot k's instructions are slot 0's but for the one that loads the slot
/// number. The floor is measured with a spare slot's programs and taken out of every
/// traced slot's samples; while the compiler folded the slot in, the slots' programs
/// differed in length (fentry_lean 999 instructions in slot 0, 1032 in the others; fentry
/// 1750-1771 across the slots) and the floor's window was a few instructions off the
/// traced one's (under an instruction-counted clock, fentry's own time per call of
/// obj_cgroup_charge moved from 66.9 to 69.0 ns with a change elsewhere in the programs,
/// while the function did not change).
#[test]
fn slot_programs_are_one_code() {
    for (what, bytes) in [("full", EBPF_OBJECT), ("legacy", EBPF_LEGACY)] {
        if bytes.is_empty() {
            eprintln!(
                "skipping slot_programs_are_one_code: built with AYA_BUILD_SKIP (no eBPF object)"
            );
            return;
        }

        let mut obj = aya_obj::Object::parse(bytes).expect("the eBPF object");
        let text: std::collections::HashSet<usize> =
            obj.functions.keys().map(|(s, _)| *s).collect();
        // Each map (and global) as a file descriptor of its own, as the loader relocates
        // them: two slots that read different maps or globals differ here.
        let maps = obj.maps.clone();
        obj.relocate_maps(
            maps.iter()
                .enumerate()
                .map(|(i, (name, m))| (name.as_str(), 1000 + i as std::os::fd::RawFd, m)),
            &text,
        )
        .expect("the maps relocated");
        obj.relocate_calls(&text).expect("the calls linked");

        // (code, dst, src, off, imm) of each instruction of a program as linked.
        let insns = |name: &str| -> Vec<(u8, u8, u8, i16, i32)> {
            let p = obj
                .programs
                .get(name)
                .unwrap_or_else(|| panic!("{what}: program {name} missing"));
            obj.functions[&p.function_key()]
                .instructions
                .iter()
                .map(|i| (i.code, i.dst_reg(), i.src_reg(), i.off, i.imm))
                .collect()
        };
        for family in [
            names::FENTRY,
            names::FEXIT,
            names::FENTRY_PATCHED,
            names::FEXIT_PATCHED,
            names::FENTRY_LEAN,
            names::FEXIT_LEAN,
            names::KPROBE,
            names::KRETPROBE,
            names::TP,
        ] {
            let first = insns(family[0]);
            for (k, name) in family.iter().enumerate().skip(1) {
                let other = insns(name);
                assert_eq!(
                    other.len(),
                    first.len(),
                    "{what}: {name} has {} instructions, {} {}",
                    other.len(),
                    family[0],
                    first.len()
                );
                let differ: Vec<usize> =
                    (0..first.len()).filter(|&i| first[i] != other[i]).collect();
                // The one difference: a 64-bit move of an immediate into the same
                // register (BPF_ALU64 | BPF_MOV | BPF_K), the slot number apart.
                let [i] = differ[..] else {
                    panic!(
                        "{what}: {name} differs from {} in instructions {differ:?}",
                        family[0]
                    );
                };
                let (a, b) = (first[i], other[i]);
                assert!(
                    a.0 == 0xb7 && b.0 == 0xb7 && a.1 == b.1 && b.4 - a.4 == k as i32,
                    "{what}: {name} differs from {} at instruction {i}: {a:?} against {b:?}",
                    family[0]
                );
            }
        }
    }
}

/// Every probe slot's patched and lean pairs load each `LeanField` through its marker (the
/// loader's `patch::lean_fields` then writes the kernel's offset into them), and the
/// general pairs none: a build that lost its marked loads would read the fields through
/// the layout instead, or the general programs would be refused where the loader does not
/// patch. Counted per pair, in each program's own instructions.
#[test]
fn patched_pairs_load_every_lean_field_by_marker_and_general_ones_none() {
    use memcg_trace_common::LeanField;
    for (what, bytes) in [("full", EBPF_OBJECT), ("legacy", EBPF_LEGACY)] {
        if bytes.is_empty() {
            eprintln!("skipping patched_pairs_load_every_lean_field_by_marker_and_general_ones_none: built with AYA_BUILD_SKIP (no eBPF object)");
            return;
        }

        let obj = aya_obj::Object::parse(bytes).expect("the eBPF object");

        // Marked u64 loads (BPF_LDX | BPF_MEM | BPF_DW) per field in one program.
        let marked = |name: &str| -> Vec<usize> {
            let p = obj
                .programs
                .get(name)
                .unwrap_or_else(|| panic!("{what}: program {name} missing"));
            let insns = &obj.functions[&p.function_key()].instructions;
            LeanField::ALL
                .iter()
                .map(|f| {
                    insns
                        .iter()
                        .filter(|i| i.code == 0x79 && i.off == f.marker())
                        .count()
                })
                .collect()
        };
        for s in 0..memcg_trace_common::MAX_PROBES {
            for (entry, exit) in [
                (names::FENTRY_PATCHED[s], names::FEXIT_PATCHED[s]),
                (names::FENTRY_LEAN[s], names::FEXIT_LEAN[s]),
            ] {
                let (a, b) = (marked(entry), marked(exit));
                for (i, f) in LeanField::ALL.iter().enumerate() {
                    assert!(
                        a[i] + b[i] > 0,
                        "{what}: {entry}/{exit} load {f:?} by no marker"
                    );
                }
            }

            for general in [
                names::FENTRY[s],
                names::FEXIT[s],
                names::KPROBE[s],
                names::KRETPROBE[s],
            ] {
                assert!(
                    marked(general).iter().all(|&n| n == 0),
                    "{what}: {general} has marked loads"
                );
            }
        }
    }
}

/// Each build's programs of a probe slot, by name.
#[test]
fn each_build_names_its_programs() {
    use FentryBuild::*;
    assert_eq!(
        slot_programs(Backend::Fentry, 3, Lean),
        ["fentry_lean_3", "fexit_lean_3"]
    );
    assert_eq!(
        slot_programs(Backend::Fentry, 3, Patched),
        ["fentry_patched_3", "fexit_patched_3"]
    );
    assert_eq!(
        slot_programs(Backend::Fentry, 3, General),
        ["fentry_3", "fexit_3"]
    );

    // kprobes and tracepoints have one build.
    for b in [General, Patched, Lean] {
        assert_eq!(
            slot_programs(Backend::Kprobe, 3, b),
            ["kprobe_3", "kretprobe_3"]
        );
        assert_eq!(slot_programs(Backend::Tracepoint, 3, b), ["tp_3"]);
    }
}

#[test]
fn fentry_builds_only_where_what_they_fold_away_holds() {
    use FentryBuild::*;
    let direct = KernelLayout {
        direct_task: 1,
        direct_cgroup: 1,
        ..Default::default()
    };
    let usual = LoadOptions {
        workload_cgroup: 7,
        workload_owned: true,
        probes: 3,
        ..Default::default()
    };
    assert_eq!(fentry_build(&usual, &direct), Lean);

    // Any setting the lean programs fold away as off takes the patched ones.
    let opt_in = [
        LoadOptions {
            features: Features {
                callers: true,
                stack_depth: 4,
                ..usual.features
            },
            ..usual
        },
        LoadOptions {
            features: Features {
                by_memcg: true,
                ..usual.features
            },
            ..usual
        },
        LoadOptions {
            features: Features {
                workload_memcg: true,
                ..usual.features
            },
            ..usual
        },
    ];
    for o in &opt_in {
        assert_eq!(fentry_build(o, &direct), Patched, "{o:?}");
    }

    // fentry runs that interleave (a preemptible kernel, or no context split) take the
    // general ones, whatever the settings.
    for o in opt_in.iter().chain([&usual]) {
        let o = LoadOptions {
            preemptible: true,
            ..*o
        };
        assert_eq!(fentry_build(&o, &direct), General, "{o:?}");
    }

    // So does a kernel where the task or its cgroup are not plain loads (or --probe-read,
    // which turns direct task reads off).
    for l in [
        KernelLayout {
            direct_task: 0,
            ..direct
        },
        KernelLayout {
            direct_cgroup: 0,
            ..direct
        },
        // A task field beyond a load's 16-bit offset (patch::lean_fields).
        KernelLayout {
            task_migrations: 0x8000,
            ..direct
        },
    ] {
        assert_eq!(fentry_build(&usual, &l), General);
        assert_eq!(fentry_build(&opt_in[0], &l), General);
    }
}
