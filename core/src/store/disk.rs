//! The disk tier (`--kv-disk DIR`, `--kv-disk-gb N`): one file per stored block,
//! `DIR/ab/abcdef….kvb` by its key, written to a temporary name and renamed (a reader or a
//! restart never sees half a file under a key's name; a crash leaves a temporary file, removed
//! at the next start). An index in memory (built by scanning the directory at start, oldest
//! modification first) knows every key and its size; past the budget the least recently used
//! files go. A write that fails (a full disk) stops the tier's writing, with a warning; reads go on.

use super::{BlockKey, Tier};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::SystemTime;

const EXT: &str = "kvb";

pub struct DiskTier {
    dir: PathBuf,
    budget: u64,
    index: Mutex<Index>,
    /// A write failed: the tier stopped writing.
    stopped: AtomicBool,
}

#[derive(Default)]
struct Index {
    /// Each file's size and when it was last used (a tick).
    files: HashMap<BlockKey, (u64, u64)>,
    bytes: u64,
    tick: u64,
}

impl DiskTier {
    /// The tier in `dir` (made if missing), holding at most `budget` bytes: indexes the blocks
    /// already there, oldest first, and removes temporary files a crash left.
    pub fn open(dir: &Path, budget: u64) -> std::io::Result<DiskTier> {
        std::fs::create_dir_all(dir)?;
        let mut found: Vec<(SystemTime, BlockKey, u64)> = vec![];
        for sub in std::fs::read_dir(dir)?.flatten().filter(|e| e.path().is_dir()) {
            for f in std::fs::read_dir(sub.path())?.flatten() {
                let path = f.path();
                let meta = f.metadata()?;
                match key_of(&path) {
                    Some(key) => found.push((meta.modified()?, key, meta.len())),
                    // A crash's leftovers; a younger one may be another process's write in flight.
                    None if path.extension().is_some_and(|e| e == "tmp") && stale(&meta) => {
                        let _ = std::fs::remove_file(&path);
                    }
                    None => {}
                }
            }
        }
        found.sort_by_key(|&(t, _, _)| t);
        let mut index = Index::default();
        for (_, key, size) in found {
            index.tick += 1;
            index.files.insert(key, (size, index.tick));
            index.bytes += size;
        }
        let tier =
            DiskTier { dir: dir.to_path_buf(), budget, index: Mutex::new(index), stopped: AtomicBool::new(false) };
        tier.evict();
        Ok(tier)
    }

    fn path(&self, key: BlockKey) -> PathBuf {
        let hex = key.hex();
        self.dir.join(&hex[..2]).join(format!("{hex}.{EXT}"))
    }

    fn index(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn has(&self, key: BlockKey) -> bool {
        self.index().files.contains_key(&key)
    }

    /// Every key held.
    pub fn keys(&self) -> Vec<BlockKey> {
        self.index().files.keys().copied().collect()
    }

    /// Blocks and bytes held.
    pub fn held(&self) -> (usize, u64) {
        let i = self.index();
        (i.files.len(), i.bytes)
    }

    /// The stored bytes of `key`, marked used now (None if it is not here, or cannot be read).
    pub fn get(&self, key: BlockKey) -> Option<Vec<u8>> {
        {
            let mut i = self.index();
            i.tick += 1;
            let tick = i.tick;
            i.files.get_mut(&key)?.1 = tick;
        }
        let bytes = std::fs::read(self.path(key));
        if bytes.is_err() {
            self.forget(key);
        }
        bytes.ok()
    }

    /// Stores `bytes` under `key` unless it is there already (a key names one content), then
    /// evicts to the budget. False when the tier has stopped writing.
    pub fn put(&self, key: BlockKey, bytes: &[u8]) -> bool {
        if self.stopped.load(Ordering::Relaxed) {
            return false;
        }
        if self.has(key) {
            return true;
        }
        if bytes.len() as u64 > self.budget {
            return false; // larger than the whole tier: never written, counted as skipped
        }
        let path = self.path(key);
        let tmp = path.with_extension(format!("{}.tmp", std::process::id()));
        let written = std::fs::create_dir_all(path.parent().expect("a subdirectory"))
            .and_then(|_| std::fs::write(&tmp, bytes))
            .and_then(|_| std::fs::rename(&tmp, &path));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            if e.kind() == std::io::ErrorKind::NotFound && path.parent().is_some_and(Path::is_dir) {
                return false; // the temporary file went (another process's cleanup): this one write
            }
            tracing::warn!("the K/V disk tier {} stopped writing: {e}", self.dir.display());
            self.stopped.store(true, Ordering::Relaxed);
            return false;
        }
        let mut i = self.index();
        i.tick += 1;
        let tick = i.tick;
        i.files.insert(key, (bytes.len() as u64, tick));
        i.bytes += bytes.len() as u64;
        drop(i);
        self.evict();
        true
    }

    /// Removes a block (refused when read: it will not be found again).
    pub fn remove(&self, key: BlockKey) {
        self.forget(key);
        let _ = std::fs::remove_file(self.path(key));
    }

    fn forget(&self, key: BlockKey) {
        let mut i = self.index();
        if let Some((size, _)) = i.files.remove(&key) {
            i.bytes -= size;
        }
    }

    /// Removes the least recently used files until the tier is within its budget.
    fn evict(&self) {
        loop {
            let victim = {
                let i = self.index();
                if i.bytes <= self.budget {
                    return;
                }
                i.files.iter().min_by_key(|(_, &(_, tick))| tick).map(|(&k, _)| k)
            };
            match victim {
                Some(k) => self.remove(k),
                None => return,
            }
        }
    }
}

impl Tier for DiskTier {
    fn name(&self) -> &'static str {
        "disk"
    }
    fn has(&self, key: BlockKey) -> bool {
        DiskTier::has(self, key)
    }
    fn get(&self, key: BlockKey) -> Option<Vec<u8>> {
        DiskTier::get(self, key)
    }
    fn put(&self, key: BlockKey, bytes: &[u8]) -> bool {
        DiskTier::put(self, key, bytes)
    }
    fn remove(&self, key: BlockKey) {
        DiskTier::remove(self, key)
    }
    fn held(&self) -> Option<(usize, u64)> {
        Some(DiskTier::held(self))
    }
}

/// Whether a temporary file is old enough to be a crash's, not a write in flight (ten minutes).
fn stale(meta: &std::fs::Metadata) -> bool {
    meta.modified().ok().and_then(|t| t.elapsed().ok()).is_some_and(|age| age.as_secs() > 600)
}

/// The key a block file's name gives (None for any other file).
fn key_of(path: &Path) -> Option<BlockKey> {
    if path.extension()? != EXT {
        return None;
    }
    let stem = path.file_stem()?.to_str()?;
    let bytes: Vec<u8> = (0..stem.len())
        .step_by(2)
        .map(|i| stem.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
        .collect::<Option<_>>()?;
    Some(BlockKey(bytes.try_into().ok()?))
}
