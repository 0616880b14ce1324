//! [`FileStore`]: torch's `FileStore`, a store in one file on a file system every process of
//! the job sees (`init_method file:///shared/path`).
//!
//! The file holds the whole table: a magic line, then the bincode of its entries. Every
//! operation opens the file, takes an advisory lock on it (`flock`: exclusive to change it,
//! shared to read it), reads it, and for a change writes it back in place before unlocking,
//! so that concurrent processes see each change whole. A `get` or `wait` for a key not there
//! yet polls, backing off from 1 ms to 50 ms. A file that is not a store's (or is damaged) is
//! an [`Error::Store`] naming it; its length is checked before anything is read into memory.
//!
//! On NFS, Linux maps `flock` onto the server's byte-range locks; other network file systems
//! may not lock at all, and then concurrent changes can be lost. Prefer the TCP store there.

use super::{add_in, compare_set_in, Store};
use collectix_runtime::{Error, Result};
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The first bytes of a store file.
const MAGIC: &[u8; 16] = b"collectix-store1";
/// The largest store file read.
const MAX_FILE: u64 = 64 << 20;

/// A store in a file (see the module doc).
pub struct FileStore {
    path: PathBuf,
}

type Map = HashMap<String, Vec<u8>>;

impl FileStore {
    /// The store in the file at `path`, created empty if it does not exist.
    pub fn new(path: impl Into<PathBuf>) -> Result<FileStore> {
        let store = FileStore { path: path.into() };
        store.locked(true, |_| Ok(((), false)))?;
        Ok(store)
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn err(&self, what: impl std::fmt::Display) -> Error {
        Error::Store(format!("{}: {what}", self.path.display()))
    }

    /// Runs `f` on the table under the file's lock (exclusive if `write`); `f` says whether
    /// it changed the table, which is then written back.
    fn locked<T>(&self, write: bool, f: impl FnOnce(&mut Map) -> Result<(T, bool)>) -> Result<T> {
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&self.path)
            .map_err(|e| self.err(e))?;
        if write {
            file.lock()
                .map_err(|e| self.err(format!("cannot lock: {e}")))?;
        } else {
            file.lock_shared()
                .map_err(|e| self.err(format!("cannot lock: {e}")))?;
        }
        let result = self.read(&mut file).and_then(|mut map| {
            let (v, changed) = f(&mut map)?;
            if changed {
                self.write(&mut file, &map)?;
            }
            Ok(v)
        });
        let _ = file.unlock();
        result
    }

    fn read(&self, file: &mut File) -> Result<Map> {
        let len = file.metadata().map_err(|e| self.err(e))?.len();
        if len == 0 {
            return Ok(Map::new());
        }
        if len > MAX_FILE {
            return Err(self.err(format!(
                "{len} bytes: larger than a store file can be ({MAX_FILE})"
            )));
        }
        let mut bytes = Vec::with_capacity(len as usize);
        file.seek(SeekFrom::Start(0)).map_err(|e| self.err(e))?;
        file.take(MAX_FILE)
            .read_to_end(&mut bytes)
            .map_err(|e| self.err(e))?;
        let body = bytes
            .strip_prefix(MAGIC.as_slice())
            .ok_or_else(|| self.err("not a collectix store file"))?;
        let cfg = bincode::config::standard().with_limit::<{ MAX_FILE as usize }>();
        let (entries, used): (Vec<(String, Vec<u8>)>, usize) =
            bincode::serde::decode_from_slice(body, cfg)
                .map_err(|e| self.err(format!("damaged store file: {e}")))?;
        if used != body.len() {
            return Err(self.err("damaged store file: bytes after the table"));
        }
        Ok(entries.into_iter().collect())
    }

    fn write(&self, file: &mut File, map: &Map) -> Result<()> {
        let mut entries: Vec<(&String, &Vec<u8>)> = map.iter().collect();
        entries.sort();
        let body = bincode::serde::encode_to_vec(&entries, bincode::config::standard())
            .map_err(|e| self.err(e))?;
        let mut bytes = Vec::with_capacity(MAGIC.len() + body.len());
        bytes.extend_from_slice(MAGIC);
        bytes.extend_from_slice(&body);
        if bytes.len() as u64 > MAX_FILE {
            return Err(self.err(format!(
                "the table would take {} bytes (the limit is {MAX_FILE})",
                bytes.len()
            )));
        }
        file.seek(SeekFrom::Start(0)).map_err(|e| self.err(e))?;
        file.write_all(&bytes).map_err(|e| self.err(e))?;
        file.set_len(bytes.len() as u64).map_err(|e| self.err(e))?;
        file.flush().map_err(|e| self.err(e))
    }

    /// Polls until `f` finds what it wants, for at most `timeout`.
    fn poll<T>(
        &self,
        timeout: Duration,
        what: impl Fn(&Map) -> String,
        f: impl Fn(&Map) -> Option<T>,
    ) -> Result<T> {
        let deadline = crate::sync::deadline_after(timeout);
        let mut pause = Duration::from_millis(1);
        loop {
            let (found, missing) = self.locked(false, |m| Ok(((f(m), what(m)), false)))?;
            if let Some(v) = found {
                return Ok(v);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::StoreTimeout {
                    what: missing,
                    waited_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
                });
            }
            std::thread::sleep(pause.min(left));
            pause = (pause * 2).min(Duration::from_millis(50));
        }
    }
}

impl Store for FileStore {
    fn set(&self, key: &str, value: Vec<u8>) -> Result<()> {
        self.locked(true, |m| {
            m.insert(key.to_owned(), value);
            Ok(((), true))
        })
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.poll(timeout, |_| key.to_string(), |m| m.get(key).cloned())
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        self.locked(true, |m| Ok((add_in(m, key, delta)?, true)))
    }

    fn compare_set(&self, key: &str, expected: &[u8], desired: Vec<u8>) -> Result<Vec<u8>> {
        self.locked(true, |m| {
            Ok((compare_set_in(m, key, expected, desired), true))
        })
    }

    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        let missing = |m: &Map| {
            keys.iter()
                .copied()
                .filter(|k| !m.contains_key(*k))
                .collect::<Vec<_>>()
                .join(", ")
        };
        self.poll(timeout, missing, |m| {
            keys.iter().all(|k| m.contains_key(*k)).then_some(())
        })
    }

    fn check(&self, keys: &[&str]) -> Result<bool> {
        self.locked(false, |m| {
            Ok((keys.iter().all(|k| m.contains_key(*k)), false))
        })
    }

    fn delete(&self, key: &str) -> Result<bool> {
        self.locked(true, |m| {
            let gone = m.remove(key).is_some();
            Ok((gone, gone))
        })
    }

    fn num_keys(&self) -> Result<u64> {
        self.locked(false, |m| Ok((m.len() as u64, false)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("collectix-filestore-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&dir);
        dir
    }

    #[test]
    fn the_file_store_has_torch_semantics() {
        let p = temp("semantics");
        let s = FileStore::new(&p).unwrap_or_else(|e| panic!("{e}"));
        super::super::tests::semantics(&s);
        let _ = std::fs::remove_file(p);
    }

    #[test]
    fn concurrent_adds_through_separate_handles_end_exact() {
        let p = temp("adds");
        let (threads, adds) = (8, 100);
        std::thread::scope(|sc| {
            for _ in 0..threads {
                sc.spawn(|| {
                    // Each its own file description: the lock works between them as between
                    // processes.
                    let s = FileStore::new(&p).unwrap_or_else(|e| panic!("{e}"));
                    for _ in 0..adds {
                        assert!(s.add("n", 1).is_ok());
                    }
                });
            }
        });
        let s = FileStore::new(&p).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.add("n", 0), Ok(threads * adds));
        // A get waits for a set from another handle.
        let t = std::thread::spawn({
            let p = p.clone();
            move || FileStore::new(&p).and_then(|s| s.get("late", Duration::from_secs(10)))
        });
        std::thread::sleep(Duration::from_millis(30));
        assert!(s.set("late", b"here".to_vec()).is_ok());
        assert_eq!(t.join().ok().and_then(Result::ok), Some(b"here".to_vec()));
        let _ = std::fs::remove_file(p);
    }

    #[test]
    fn a_file_that_is_not_a_store_is_refused_by_name() {
        let p = temp("garbage");
        std::fs::write(&p, b"#!/bin/sh\necho not a store\n").unwrap_or(());
        let got = FileStore::new(&p).and_then(|s| s.num_keys());
        assert!(
            matches!(&got, Err(Error::Store(m)) if m.contains("not a collectix store file") && m.contains("garbage")),
            "{got:?}"
        );
        // The magic, then a table claiming 2^60 entries: refused, nothing allocated for them.
        let mut bytes = MAGIC.to_vec();
        bytes.push(0xfd);
        bytes.extend_from_slice(&(1u64 << 60).to_le_bytes());
        std::fs::write(&p, &bytes).unwrap_or(());
        let got = FileStore::new(&p).and_then(|s| s.num_keys());
        assert!(
            matches!(&got, Err(Error::Store(m)) if m.contains("damaged")),
            "{got:?}"
        );
        let _ = std::fs::remove_file(p);
    }
}
