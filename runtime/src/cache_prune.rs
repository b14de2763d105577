//! The cache directory's size limit ([`coil_ir::config::Config::cache_max_bytes`]): least
//! recently used files go first, as ccache does.
//!
//! Every artifact is a file under one of the cache's subfolders ([`SUBFOLDERS`]: C shared
//! objects and their sources, CUBINs, autotune choices, whole graphs, remembered dynamic dims).
//! A hit marks its entry used by moving its modification time to now (at most once a day per
//! entry: [`mark_used`]), so the modification time orders files by last use. The first time a
//! process writes an entry under a cache root ([`after_write`]), a background thread adds up
//! the root's files and, when they exceed the limit, removes the oldest until they take 90% of
//! it. Removing a file another process is loading is safe (it keeps its open copy); one it looks
//! up next is a miss and is built again. Files outside the subfolders are never touched, so a
//! cache directory shared with other data loses only coil's files.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

/// The cache root's subfolders that hold coil's artifacts.
pub const SUBFOLDERS: [&str; 5] = ["c", "cuda", "autotune", "graphs", "dynamic"];

/// A hit older than this is marked used again ([`mark_used`]); a younger one is left alone,
/// so a warm start costs one `stat` per entry, not a write.
const MARK_AFTER: Duration = Duration::from_secs(24 * 3600);

/// Moves `path`'s modification time to now when it is older than a day: the entry was just
/// used. Failures are ignored (a read-only cache is still a cache).
pub fn mark_used(path: &Path) {
    let now = SystemTime::now();
    let stale = std::fs::metadata(path)
        .and_then(|m| m.modified())
        .is_ok_and(|t| now.duration_since(t).unwrap_or_default() > MARK_AFTER);
    if stale {
        if let Ok(f) = std::fs::File::options().append(true).open(path) {
            let _ = f.set_modified(now);
        }
    }
}

/// Called after an entry was written at `path`: the first time in this process for the
/// configuration's cache root (when `path` is under it), prunes the root in the background
/// to the configuration's limit.
pub fn after_write(path: &Path) {
    static PRUNED: Mutex<Option<HashSet<PathBuf>>> = Mutex::new(None);
    let config = coil_ir::config::current();
    let Some(max) = config.cache_max_bytes else { return };
    let root = config.cache_dir.clone();
    if !path.starts_with(&root) {
        return;
    }
    let first = PRUNED.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert_with(HashSet::new).insert(root.clone());
    if first && due(&root) {
        std::thread::spawn(move || prune(&root, max));
    }
}

/// Whether `root` was last pruned (by any process) more than [`PRUNE_EVERY`] ago, by the
/// modification time of its [`STAMP`] file, which this call then moves to now: a walk over a
/// large cache's files costs a fraction of a second, and a test run starts dozens of processes.
fn due(root: &Path) -> bool {
    let stamp = root.join(STAMP);
    let now = SystemTime::now();
    let recent = std::fs::metadata(&stamp)
        .and_then(|m| m.modified())
        .is_ok_and(|t| now.duration_since(t).unwrap_or_default() < PRUNE_EVERY);
    if recent {
        return false;
    }
    std::fs::write(&stamp, b"").is_ok()
}

/// The file whose modification time is the cache root's last prune ([`after_write`]).
pub const STAMP: &str = "last-prune";

/// How often a cache root is pruned at most ([`after_write`]).
const PRUNE_EVERY: Duration = Duration::from_secs(3600);

/// What [`prune`] found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pruned {
    /// Bytes of coil's files under the root before.
    pub bytes_before: u64,
    /// Bytes removed.
    pub bytes_removed: u64,
    /// Files removed.
    pub files_removed: usize,
}

/// Removes the least recently modified files of `root`'s [`SUBFOLDERS`] while they take more
/// than `max_bytes`, down to 90% of it; nothing when they fit.
///
/// ```
/// use coil_runtime::cache_prune::prune;
/// let root = std::env::temp_dir().join(format!("coil-prune-doc-{}", std::process::id()));
/// std::fs::create_dir_all(root.join("c")).unwrap();
/// std::fs::write(root.join("c/a.so.entry"), vec![0u8; 1000]).unwrap();
/// assert_eq!(prune(&root, 10_000).files_removed, 0);
/// assert_eq!(prune(&root, 500).files_removed, 1);
/// std::fs::remove_dir_all(&root).unwrap();
/// ```
pub fn prune(root: &Path, max_bytes: u64) -> Pruned {
    let mut files: Vec<(SystemTime, u64, PathBuf)> = Vec::new();
    for sub in SUBFOLDERS {
        let Ok(entries) = std::fs::read_dir(root.join(sub)) else { continue };
        for e in entries.flatten() {
            let Ok(meta) = e.metadata() else { continue };
            if meta.is_file() {
                files.push((meta.modified().unwrap_or(SystemTime::UNIX_EPOCH), meta.len(), e.path()));
            }
        }
    }
    let bytes_before: u64 = files.iter().map(|f| f.1).sum();
    let mut pruned = Pruned { bytes_before, ..Pruned::default() };
    if bytes_before <= max_bytes {
        return pruned;
    }
    let target = max_bytes / 10 * 9;
    files.sort();
    let mut left = bytes_before;
    for (_, len, path) in files {
        if left <= target {
            break;
        }
        if std::fs::remove_file(&path).is_ok() {
            left -= len;
            pruned.bytes_removed += len;
            pruned.files_removed += 1;
        }
    }
    pruned
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::cpu::tests::TempDir;

    /// A file of `len` bytes under `dir`, last modified `age_s` seconds ago.
    fn file(dir: &TempDir, rel: &str, len: usize, age_s: u64) -> PathBuf {
        let p = dir.0.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, vec![7u8; len]).unwrap();
        let f = std::fs::File::options().append(true).open(&p).unwrap();
        f.set_modified(SystemTime::now() - Duration::from_secs(age_s)).unwrap();
        p
    }

    #[test]
    fn the_least_recently_used_files_go_first_down_to_ninety_percent() {
        let r = TempDir::new("prune-lru");
        let old = file(&r, "c/old.so.entry", 400, 3000);
        let older_graph = file(&r, "graphs/g.graph.entry", 300, 4000);
        let young = file(&r, "cuda/young.cubin.entry", 400, 10);
        let middle = file(&r, "autotune/m.choice.entry", 200, 2000);
        let foreign = file(&r, "notes.txt", 5000, 9000);
        let p = prune(&r.0, 1000);
        assert_eq!(p.bytes_before, 1300);
        // 90% of 1000: the two oldest (300 + 400) go, leaving 600.
        assert_eq!((p.files_removed, p.bytes_removed), (2, 700));
        assert!(!older_graph.exists() && !old.exists());
        assert!(young.exists() && middle.exists() && foreign.exists());
        assert_eq!(prune(&r.0, 1000).files_removed, 0);
    }

    #[test]
    fn a_used_entry_outlives_a_younger_unused_one() {
        let r = TempDir::new("prune-mark");
        let used = file(&r, "c/used.so.entry", 500, 5 * 24 * 3600);
        let unused = file(&r, "c/unused.so.entry", 500, 2 * 24 * 3600);
        let recent = file(&r, "c/recent.so.entry", 500, 60);
        let before = std::fs::metadata(&recent).unwrap().modified().unwrap();
        mark_used(&used);
        mark_used(&recent);
        assert_eq!(std::fs::metadata(&recent).unwrap().modified().unwrap(), before, "a recent entry is not rewritten");
        prune(&r.0, 1200);
        assert!(used.exists() && recent.exists() && !unused.exists());
    }

    #[test]
    fn a_root_is_pruned_at_most_once_an_hour() {
        let r = TempDir::new("prune-due");
        assert!(due(&r.0), "never pruned");
        assert!(!due(&r.0), "pruned a moment ago");
        let stamp = std::fs::File::options().append(true).open(r.0.join(STAMP)).unwrap();
        stamp.set_modified(SystemTime::now() - Duration::from_secs(7200)).unwrap();
        assert!(due(&r.0), "pruned two hours ago");
    }
}
