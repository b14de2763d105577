//! Verified entries of the on-disk cache, one format for every artifact: the C backend's shared
//! objects (`cpu::compiler`), the CUDA backend's CUBINs (`cuda::compiler`), the autotuner's
//! choices (`cuda::autotune`) and whole compiled graphs (the frontend's graph cache).
//!
//! An entry is one file, `<dir>/<key>.<kind>.entry`: a header line, then the payload:
//!
//! ```text
//! coil-cache-entry 1 <kind> <key> <payload bytes> <checksum>\n<payload>
//! ```
//!
//! `<kind>` is `so`, `cubin`, `choice` or `graph`; `<key>` the 32 hex digits of the cache key the entry
//! was built for ([`key`]); `<checksum>` the 16 hex digits of [`checksum`] of the payload.
//! ([`read`]) checks all of them before a payload is used: an entry that is empty, truncated,
//! damaged (one flipped byte always changes the checksum), of another kind or built for another
//! key (a file copied or renamed from another entry) is [`Lookup::Invalid`], with the reason;
//! callers log it ([`log_invalid`]) and rebuild, never load it. The payload after the first
//! line is the artifact itself (`tail -n +2 X.cubin.entry > X.cubin` for `cuobjdump`).
//!
//! **Writes** ([`write()`], [`write_atomically`]) go to a private temporary name in the entry's
//! directory, then are renamed into place: a reader sees the old entry or the new one, never a
//! partial file, and two processes building the same key each rename a whole entry (the last
//! wins; both are correct for the key). Entries are not `fsync`ed: that would add disk latency
//! to every cold compile (the CUDA backend writes one entry per kernel), and a cache needs no
//! durability; an entry torn by a crash fails its checksum and is rebuilt.
//!
//! **Size**: a hit marks its entry used, and the first write of a process prunes the cache to
//! the configuration's limit, least recently used first ([`crate::cache_prune`]).
//!
//! The threat is corruption and mix-ups, not an attacker: FNV-1a (64 bits for the checksum,
//! 128 for keys) needs no dependency and is stable across Rust versions and platforms.

use coil_ir::{Error, Result};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The first word of every entry.
const MAGIC: &str = "coil-cache-entry";
/// The header's layout version (the second word).
const VERSION: &str = "1";
/// A header is one short line; a file whose first this-many bytes hold no newline has none.
const MAX_HEADER: usize = 256;

/// What an entry holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A shared object of C kernels (`c/`).
    SharedObject,
    /// A CUBIN (`cuda/`).
    Cubin,
    /// An autotuner choice, as text (`autotune/`).
    Choice,
    /// A whole compiled graph: its loop program, schedule and kernels' binary keys, as text
    /// (`graphs/`).
    Graph,
}

impl Kind {
    /// Its name in headers and file names.
    pub fn name(self) -> &'static str {
        match self {
            Kind::SharedObject => "so",
            Kind::Cubin => "cubin",
            Kind::Choice => "choice",
            Kind::Graph => "graph",
        }
    }
}

/// A cache key: hex of a 128-bit FNV-1a hash of `parts`, each prefixed by its length (so that
/// `["ab", "c"]` and `["a", "bc"]` differ).
pub fn key(parts: &[&str]) -> String {
    let mut h = Fnv128::new();
    for part in parts {
        h.write(&(part.len() as u64).to_le_bytes());
        h.write(part.as_bytes());
    }
    format!("{:032x}", h.finish())
}

/// The checksum of a payload: 64-bit FNV-1a. Each step is a bijection of the running state for a
/// given byte, so any change of a single byte changes the result.
pub fn checksum(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// `<dir>/<key>.<kind>.entry`.
pub fn path(dir: &Path, key: &str, kind: Kind) -> PathBuf {
    dir.join(format!("{key}.{}.entry", kind.name()))
}

/// What [`read`] found.
#[derive(Clone, Debug, PartialEq)]
pub enum Lookup {
    /// A verified entry: its payload.
    Found(Vec<u8>),
    /// No file: an ordinary miss.
    Missing,
    /// A file that must not be used, and why.
    Invalid(String),
}

/// Reads the entry at `path`, which must hold a `kind` built for `key`, and checks it (see the
/// module doc). The file is read once: the payload returned is the one checked.
pub fn read(path: &Path, kind: Kind, key: &str) -> Lookup {
    let mut bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Lookup::Missing,
        Err(e) => return Lookup::Invalid(format!("cannot be read: {e}")),
    };
    match check(&bytes, kind, key) {
        Ok(start) => {
            bytes.drain(..start);
            crate::cache_prune::mark_used(path);
            Lookup::Found(bytes)
        }
        Err(why) => Lookup::Invalid(why),
    }
}

/// Where the payload of a valid entry starts, else why it is not valid.
fn check(bytes: &[u8], kind: Kind, key: &str) -> std::result::Result<usize, String> {
    if bytes.is_empty() {
        return Err("the file is empty".into());
    }
    if !bytes.starts_with(MAGIC.as_bytes()) || bytes.get(MAGIC.len()) != Some(&b' ') {
        return Err("no entry header: not a coil cache entry".into());
    }
    let damaged = || format!("a damaged header: {:?}", String::from_utf8_lossy(&bytes[..bytes.len().min(MAX_HEADER)]));
    let end = bytes.iter().take(MAX_HEADER).position(|&b| b == b'\n').ok_or_else(damaged)?;
    let header = std::str::from_utf8(&bytes[..end]).map_err(|_| damaged())?;
    let words: Vec<&str> = header.split(' ').collect();
    let [_, version, found_kind, found_key, len, sum] = words[..] else {
        return Err(damaged());
    };
    if version != VERSION {
        return Err(format!("header version {version}, this coil reads {VERSION}"));
    }
    if found_kind != kind.name() {
        return Err(format!("it holds a {found_kind}, not a {}", kind.name()));
    }
    if found_key != key {
        return Err(format!("it was built for key {found_key}, not this one"));
    }
    let (Ok(len), Ok(sum)) = (len.parse::<usize>(), u64::from_str_radix(sum, 16)) else {
        return Err(damaged());
    };
    let payload = &bytes[end + 1..];
    if payload.len() != len {
        return Err(format!("the header gives {len} payload bytes, the file has {}", payload.len()));
    }
    let actual = checksum(payload);
    if actual != sum {
        return Err(format!("checksum mismatch: the header says {sum:016x}, the payload hashes to {actual:016x}"));
    }
    Ok(end + 1)
}

/// A payload from the cache, or built because the cache had no valid one.
#[derive(Clone, Debug, PartialEq)]
pub struct Fetched {
    /// The artifact's bytes (verified, or just built and stored).
    pub payload: Vec<u8>,
    /// True when it came from the cache.
    pub cache_hit: bool,
    /// Why the cached entry was not used (it was invalid); `None` on a hit or a plain miss.
    pub rebuilt_because: Option<String>,
}

/// The payload of the entry of `kind` for `key` at `path` when a valid one is there; else
/// (logging an invalid entry) `build`'s, stored as the entry.
pub fn fetch_or_build(path: &Path, kind: Kind, key: &str, build: impl FnOnce() -> Result<Vec<u8>>) -> Result<Fetched> {
    let because = match read(path, kind, key) {
        Lookup::Found(payload) => return Ok(Fetched { payload, cache_hit: true, rebuilt_because: None }),
        Lookup::Missing => None,
        Lookup::Invalid(why) => {
            log_invalid(path, &why);
            Some(why)
        }
    };
    rebuild(path, kind, key, because, build)
}

/// `build`'s payload, stored as the entry of `kind` for `key` at `path` whatever is there
/// (`because`: why the cached entry was not used, if there was one; the caller logged it).
pub fn rebuild(
    path: &Path,
    kind: Kind,
    key: &str,
    because: Option<String>,
    build: impl FnOnce() -> Result<Vec<u8>>,
) -> Result<Fetched> {
    let payload = build()?;
    write(path, kind, key, &payload)?;
    Ok(Fetched { payload, cache_hit: false, rebuilt_because: because })
}

/// Writes `payload` as the entry of `kind` for `key` at `path`, atomically (see the module
/// doc), creating the directory if needed.
pub fn write(path: &Path, kind: Kind, key: &str, payload: &[u8]) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::runtime(format!("cannot create the cache directory {}: {e}", dir.display())))?;
    }
    let header = format!("{MAGIC} {VERSION} {} {key} {} {:016x}\n", kind.name(), payload.len(), checksum(payload));
    let mut bytes = Vec::with_capacity(header.len() + payload.len());
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(payload);
    write_atomically(path, &bytes)?;
    crate::cache_prune::after_write(path);
    Ok(())
}

/// Writes a file atomically: a private temporary name in the same directory, then a rename.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = temp_name(path, "tmp");
    std::fs::write(&tmp, bytes).and_then(|_| std::fs::rename(&tmp, path)).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::runtime(format!("cannot write {}: {e}", path.display()))
    })
}

/// A *choice* entry's payload is one line naming the choice, then comment lines (people's
/// notes). The choice under `key` in `dir` as `parse` reads its first line, if the entry is
/// valid and `parse` accepts it; an invalid entry, or one `parse` refuses, is logged and `None`
/// returned (the caller chooses again and rewrites it).
pub fn read_choice<T>(dir: &Path, key: &str, parse: impl Fn(&str) -> Option<T>) -> Option<T> {
    let path = self::path(dir, key, Kind::Choice);
    let why = match read(&path, Kind::Choice, key) {
        Lookup::Missing => return None,
        Lookup::Found(text) => {
            let first = String::from_utf8_lossy(&text).lines().next().unwrap_or("").to_string();
            match parse(&first) {
                Some(choice) => return Some(choice),
                None => format!("its first line names no choice: {first:?}"),
            }
        }
        Lookup::Invalid(why) => why,
    };
    log_invalid(&path, &why);
    None
}

/// Writes a choice entry under `key` in `dir`: the line `choice`, then `note` as a comment.
pub fn write_choice(dir: &Path, key: &str, choice: &str, note: &str) -> Result<()> {
    let text = format!("{choice}\n# {}\n", note.replace('\n', " "));
    write(&self::path(dir, key, Kind::Choice), Kind::Choice, key, text.as_bytes())
}

/// Says, once per rejected file, on stderr, that the entry at `path` is not used and why (the
/// caller rebuilds it).
pub fn log_invalid(path: &Path, why: &str) {
    eprintln!("coil: cache entry {} rejected ({why}); rebuilding it", path.display());
}

/// `<path>.<what>-<pid>-<n>`: a name in `path`'s directory that no other process or thread uses
/// (pid, and a counter).
pub(crate) fn temp_name(path: &Path, what: &str) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{what}-{}-{n}", std::process::id()));
    path.with_file_name(name)
}

/// 128-bit FNV-1a: tiny, stable across Rust versions and platforms (unlike `DefaultHasher`),
/// and wide enough that accidental collisions between cache keys are not a concern.
struct Fnv128(u128);

impl Fnv128 {
    const OFFSET: u128 = 0x6c62272e07bb014262b821756295c58d;
    const PRIME: u128 = 0x0000000001000000000000000000013b;

    fn new() -> Fnv128 {
        Fnv128(Self::OFFSET)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= b as u128;
            self.0 = self.0.wrapping_mul(Self::PRIME);
        }
    }

    fn finish(&self) -> u128 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::cpu::tests::TempDir as Dir;

    fn invalid(l: Lookup) -> String {
        match l {
            Lookup::Invalid(why) => why,
            other => panic!("expected an invalid entry, got {other:?}"),
        }
    }

    #[test]
    fn keys_and_checksums_are_stable() {
        // Fixed values: keys name files that other processes (and coil versions) look up.
        assert_eq!(key(&[]), "6c62272e07bb014262b821756295c58d");
        assert_eq!(key(&["ab", "c"]).len(), 32);
        assert_ne!(key(&["ab", "c"]), key(&["a", "bc"]));
        assert_eq!(checksum(b""), 0xcbf29ce484222325);
        assert_eq!(checksum(b"a"), 0xaf63dc4c8601ec8c);
    }

    #[test]
    fn an_entry_round_trips_and_every_damage_is_found() {
        let dir = Dir::new("entry-round-trip");
        let (k, other) = (key(&["one"]), key(&["two"]));
        let p = path(&dir.0, &k, Kind::Cubin);
        assert_eq!(p, dir.0.join(format!("{k}.cubin.entry")));
        assert_eq!(read(&p, Kind::Cubin, &k), Lookup::Missing);
        let payload: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 251) as u8).collect();
        write(&p, Kind::Cubin, &k, &payload).unwrap();
        assert_eq!(read(&p, Kind::Cubin, &k), Lookup::Found(payload.clone()));
        let header_len = std::fs::read(&p).unwrap().iter().position(|&b| b == b'\n').unwrap() + 1;
        // only the entry is left (no temporary files)
        assert_eq!(std::fs::read_dir(&dir.0).unwrap().count(), 1);

        // another kind, another key, no header, empty, truncated, longer, flipped payload bytes
        assert!(invalid(read(&p, Kind::SharedObject, &k)).contains("not a so"));
        assert!(invalid(read(&p, Kind::Cubin, &other)).contains("built for key"));
        let good = std::fs::read(&p).unwrap();
        let damaged = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut b = good.clone();
            f(&mut b);
            std::fs::write(&p, &b).unwrap();
            invalid(read(&p, Kind::Cubin, &k))
        };
        assert!(damaged(&|b| *b = payload.clone()).contains("no entry header"));
        assert!(damaged(&|b| b.clear()).contains("empty"));
        assert!(damaged(&|b| b.truncate(b.len() - 1)).contains("999"));
        assert!(damaged(&|b| b.truncate(header_len)).contains("has 0"));
        assert!(damaged(&|b| b.push(0)).contains("1001"));
        for at in [0, 1, 500, 999] {
            for flip in [1u8, 0x80, 0xff] {
                assert!(damaged(&|b| b[header_len + at] ^= flip).contains("checksum mismatch"), "byte {at}");
            }
        }
        assert!(damaged(&|b| b[3] = b'X').contains("no entry header"));
        assert!(damaged(&|b| b[header_len - 2] = b'z').contains("damaged header"));
        // a fresh write replaces any of those
        write(&p, Kind::Cubin, &k, &payload).unwrap();
        assert_eq!(read(&p, Kind::Cubin, &k), Lookup::Found(payload));
    }

    #[test]
    fn fetch_builds_once_and_rebuilds_an_invalid_entry() {
        let dir = Dir::new("entry-fetch");
        let k = key(&["fetched"]);
        let p = path(&dir.0, &k, Kind::Choice);
        let builds = std::cell::Cell::new(0);
        let build = || {
            builds.set(builds.get() + 1);
            Ok(b"heuristic\n".to_vec())
        };
        let first = fetch_or_build(&p, Kind::Choice, &k, build).unwrap();
        assert_eq!((first.cache_hit, first.rebuilt_because.as_deref(), builds.get()), (false, None, 1));
        let hit = fetch_or_build(&p, Kind::Choice, &k, build).unwrap();
        assert_eq!((hit.payload.as_slice(), hit.cache_hit, builds.get()), (&b"heuristic\n"[..], true, 1));
        // another key's entry under this name: rebuilt once, with the reason
        let other = key(&["other"]);
        write(&p, Kind::Choice, &other, b"looped_threads=512\n").unwrap();
        let rebuilt = fetch_or_build(&p, Kind::Choice, &k, build).unwrap();
        assert!(!rebuilt.cache_hit && builds.get() == 2);
        assert!(rebuilt.rebuilt_because.unwrap().contains(&format!("built for key {other}")));
        assert!(fetch_or_build(&p, Kind::Choice, &k, build).unwrap().cache_hit);
        // a failed build stores nothing
        std::fs::remove_file(&p).unwrap();
        assert!(fetch_or_build(&p, Kind::Choice, &k, || Err(Error::runtime("no"))).is_err());
        assert_eq!(read(&p, Kind::Choice, &k), Lookup::Missing);
    }

    #[test]
    fn concurrent_writers_of_one_key_leave_a_whole_entry() {
        let dir = Dir::new("entry-concurrent");
        let k = key(&["shared"]);
        let p = path(&dir.0, &k, Kind::SharedObject);
        // Eight writers with different payloads, and readers meanwhile: every read is missing
        // or one of the payloads, whole.
        let payloads: Vec<Vec<u8>> = (0..8u8).map(|i| vec![i; 100_000 + i as usize]).collect();
        std::thread::scope(|s| {
            for payload in &payloads {
                s.spawn(|| {
                    for _ in 0..5 {
                        write(&p, Kind::SharedObject, &k, payload).unwrap();
                    }
                });
            }
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..50 {
                        match read(&p, Kind::SharedObject, &k) {
                            Lookup::Missing => {}
                            Lookup::Found(b) => assert!(payloads.contains(&b), "a mixed payload"),
                            Lookup::Invalid(why) => panic!("a reader saw a partial entry: {why}"),
                        }
                    }
                });
            }
        });
        let Lookup::Found(last) = read(&p, Kind::SharedObject, &k) else { panic!() };
        assert!(payloads.contains(&last));
        assert_eq!(std::fs::read_dir(&dir.0).unwrap().count(), 1, "no temporary files are left");
    }
}
