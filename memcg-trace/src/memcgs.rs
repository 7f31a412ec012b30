//! Which memcg pays (`--by-memcg`): the programs read, at each call's entry, the memcg the call
//! charges from the function's own argument (see `memcg_trace_common::MemcgPath`) and count the
//! call under that memcg's id (`MEMCGS`), in every context. An id is the inode number of the
//! cgroup's directory in the memory controller's hierarchy (the v2 tree, or the v1 `memory`
//! mount), so userspace names ids by walking that tree. The rows reuse the call sites' record
//! ([`crate::callers::Site`], the id in `addr`, the cgroup path in `name`).

use std::{
    collections::{HashMap, HashSet},
    fs,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

/// Names of memcg ids: their paths relative to the memory hierarchy's root (`/` for the root).
#[derive(Debug, Default)]
pub struct Names {
    /// The memory hierarchy's mount point (None: no memory controller found).
    root: Option<PathBuf>,
    known: HashMap<u64, String>,
    /// Ids a walk did not find (removed before they were named): they walk it no more.
    missing: HashSet<u64>,
}

impl Names {
    /// Names in the memory controller's hierarchy of this system.
    pub fn new() -> Self {
        Names {
            root: crate::workload::find_hierarchy().ok().map(|h| h.root),
            ..Default::default()
        }
    }

    /// Names in the tree at `root` (tests).
    pub fn at(root: &Path) -> Self {
        Names {
            root: Some(root.to_path_buf()),
            ..Default::default()
        }
    }

    /// Learns the names of `ids` not known yet, walking the hierarchy once if there are any
    /// it has not looked for before.
    pub fn resolve(&mut self, ids: impl IntoIterator<Item = u64>) {
        let new: Vec<u64> = ids
            .into_iter()
            .filter(|id| {
                *id != 0
                    && *id != memcg_trace_common::NOT_A_MEMCG
                    && !self.known.contains_key(id)
                    && !self.missing.contains(id)
            })
            .collect();
        if new.is_empty() {
            return;
        }

        if let Some(root) = &self.root {
            walk(root, root, &mut self.known);
        }

        self.missing
            .extend(new.into_iter().filter(|id| !self.known.contains_key(id)));
    }

    /// The path of memcg `id` (`unknown` for 0, `removed cgroup <id>` when it is not in the
    /// tree: removed before it was named, or in another hierarchy).
    pub fn name(&self, id: u64) -> String {
        if id == 0 {
            return "unknown".into();
        }

        if id == memcg_trace_common::NOT_A_MEMCG {
            return "(another controller's cgroup)".into();
        }

        self.known
            .get(&id)
            .cloned()
            .unwrap_or_else(|| format!("removed cgroup {id}"))
    }
}

/// Adds every cgroup under `dir` (by id, as a path relative to `root`) to `out`.
fn walk(root: &Path, dir: &Path, out: &mut HashMap<u64, String>) {
    let Ok(m) = fs::metadata(dir) else {
        return;
    };
    let rel = dir.strip_prefix(root).unwrap_or(dir);
    out.insert(m.ino(), format!("/{}", rel.display()));
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                walk(root, &e.path(), out);
            }
        }
    }
}

/// The ids of `dir` and of every cgroup below it.
pub fn subtree_ids(dir: &Path) -> Vec<u64> {
    let mut out = HashMap::new();
    walk(dir, dir, &mut out);
    out.into_keys().collect()
}

/// The id of the memcg at `dir` (its directory's inode number).
pub fn id_of(dir: &Path) -> Option<u64> {
    fs::metadata(dir).ok().map(|m| m.ino())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_named_by_their_path_under_the_root() {
        let tmp = std::env::temp_dir().join(format!("memcg-trace-names-{}", std::process::id()));
        let _ = fs::remove_dir_all(&tmp);
        let dir_a = tmp.join("a");
        fs::create_dir_all(dir_a.join("b")).unwrap();
        let mut names = Names::at(&tmp);
        let (root, ida, idb) = (
            id_of(&tmp).unwrap(),
            id_of(&dir_a).unwrap(),
            id_of(&dir_a.join("b")).unwrap(),
        );
        names.resolve([ida, idb]);
        assert_eq!(names.name(root), "/");
        assert_eq!(names.name(ida), "/a");
        assert_eq!(names.name(idb), "/a/b");
        assert_eq!(names.name(0), "unknown");
        assert_eq!(
            names.name(u64::MAX - 1),
            format!("removed cgroup {}", u64::MAX - 1)
        );
        assert_eq!(
            names.name(memcg_trace_common::NOT_A_MEMCG),
            "(another controller's cgroup)"
        );
        let mut sub = subtree_ids(&dir_a);
        sub.sort();
        let mut want = vec![ida, idb];
        want.sort();
        assert_eq!(sub, want);
        fs::remove_dir_all(&tmp).unwrap();
    }
}
