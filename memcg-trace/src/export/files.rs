//! Files written atomically and safely as root: a temporary file created new beside the
//! target, synced, then renamed over it.

use super::*;

/// A file created for writing exactly where asked: never through a symlink planted at that
/// name, never over an existing file (O_CREAT | O_EXCL | O_NOFOLLOW), mode 0644.
pub(crate) fn create_new(path: &Path) -> std::io::Result<fs::File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .mode(0o644)
        .open(path)
}

/// A temporary name next to `path` that nobody can guess.
pub(crate) fn temp_name(dir: &Path, name: &std::ffi::OsStr) -> PathBuf {
    let mut rnd = [0u8; 8];

    // SAFETY: getrandom fills the buffer it is given; on failure the time stands in.
    let n = unsafe { libc::getrandom(rnd.as_mut_ptr().cast(), rnd.len(), 0) };
    let r = if n == rnd.len() as isize {
        u64::from_ne_bytes(rnd)
    } else {
        unix_ns(SystemTime::now()) as u64 ^ std::process::id() as u64
    };
    dir.join(format!(".{}.{r:016x}.tmp", name.to_string_lossy()))
}

pub(crate) fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Refuses a path that names something other than a file (through symlinks): a device, a
/// pipe or a socket (`-o /dev/null`, `-o /dev/stdout`). Renaming a file over it would replace
/// the node or the link itself: as root, /dev/null or /dev/stdout for every process. Absent
/// paths, files, links to files and directories (refused by their own checks) pass.
pub(crate) fn refuse_special(path: &Path) -> Result<()> {
    match fs::metadata(path) {
        Ok(m) if !m.is_file() && !m.is_dir() => Err(anyhow!(
            "cannot write {}: not a regular file (a device, pipe or socket): give the path of a file",
            path.display()
        )),
        _ => Ok(()),
    }
}

/// Writes `bytes` to `path` atomically and safely as root: a new temporary file in the same
/// directory (unguessable name, O_EXCL | O_NOFOLLOW), fsync, rename over `path`, fsync of the
/// directory. A symlink planted anywhere on the way is not followed; the old file stays whole
/// until the new one is complete. A path that names a device, pipe or socket is refused
/// (`refuse_special`).
pub fn write_file_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    refuse_special(path)?;
    let dir = parent_dir(path);
    let name = path
        .file_name()
        .ok_or_else(|| anyhow!("{}: not a file path", path.display()))?;
    let tmp = temp_name(&dir, name);
    let write = || -> std::io::Result<()> {
        let mut f = create_new(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)?;
        fs::File::open(&dir)?.sync_all()
    };
    write().map_err(|e| {
        let _ = fs::remove_file(&tmp);
        anyhow!("cannot write {}: {e}", path.display())
    })
}

/// Writes `doc` to `path` atomically (see [`write_file_atomic`]).
pub fn write_atomic(path: &Path, doc: &Document) -> Result<()> {
    let mut json = serde_json::to_vec_pretty(doc).context("encode JSON")?;
    json.push(b'\n');
    write_file_atomic(path, &json)
}

/// Checks up front that `path` can be written (so a long recording is not lost at the end).
pub fn check_writable(path: &Path) -> Result<()> {
    if path.is_dir() {
        return Err(anyhow!("{}: is a directory", path.display()));
    }

    refuse_special(path)?;
    let dir = parent_dir(path);
    let probe = temp_name(&dir, std::ffi::OsStr::new("memcg-trace-probe"));
    create_new(&probe)
        .map(|_| {
            let _ = fs::remove_file(&probe);
        })
        .map_err(|e| anyhow!("cannot write {}: {e}", path.display()))
}
