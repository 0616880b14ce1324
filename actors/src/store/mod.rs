//! Key-value stores for rendezvous (c10d's `Store`): ranks that do not share memory find each
//! other through one.
//!
//! - [`MemoryStore`]: in this process, shared by reference between in-process ranks.
//! - [`TcpStore`] (a client) and [`TcpStoreServer`]: across processes and hosts, as torch's
//!   `TCPStore`. Rank 0 usually runs the server in its process; `collectix store --port P`
//!   runs one on its own.
//! - [`TorchStore`]: a client of torch's own `TCPStore` (torchrun's agent store, a Python
//!   process's store), in torch's protocol; a [`TcpStoreServer`] can serve torch's clients
//!   too ([`TcpStoreServer::open_to_torch`]).
//! - [`FileStore`]: a file on a file system every process sees (torch's `FileStore`).
//! - [`PrefixStore`]: a namespace inside another store (torch's `PrefixStore`).
//!
//! Every store has torch's semantics (the [`Store`] trait). The memory store and the TCP
//! server share one implementation of them (a private table), so the two cannot drift apart.

mod file;
pub(crate) mod proto;
pub(crate) mod tcp;
pub(crate) mod torch;

pub use file::FileStore;
pub use tcp::{TcpStore, TcpStoreServer};
pub use torch::{StoreProtocol, TorchStore};

use crate::sync::lock;
use collectix_runtime::{Error, Result};
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// c10d's `Store`.
pub trait Store: Send + Sync {
    /// Sets `key` to `value`.
    fn set(&self, key: &str, value: Vec<u8>) -> Result<()>;
    /// The value of `key`, waiting up to `timeout` for it to be set
    /// ([`Error::StoreTimeout`] naming the key after that).
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>>;
    /// Adds `delta` to the integer at `key` (0 if unset; the value is its decimal text, as in
    /// torch) and returns the new value; a sum outside `i64` is [`Error::InvalidArgument`] and
    /// leaves the value as it was (torch wraps).
    fn add(&self, key: &str, delta: i64) -> Result<i64>;
    /// torch's `compare_set`: sets `key` to `desired` if its value is `expected`, or if it is
    /// unset and `expected` is empty, and returns `desired`; otherwise changes nothing and
    /// returns the current value (or `expected`, when the key is unset).
    fn compare_set(&self, key: &str, expected: &[u8], desired: Vec<u8>) -> Result<Vec<u8>>;
    /// Waits up to `timeout` until every key is set.
    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()>;
    /// Whether every key is set, now.
    fn check(&self, keys: &[&str]) -> Result<bool>;
    /// Deletes `key`; whether it was there.
    fn delete(&self, key: &str) -> Result<bool>;
    /// How many keys are set.
    fn num_keys(&self) -> Result<u64>;
}

/// Connects to `addr` (`"host:port"`; names resolve to IPv4 or IPv6) and hands the
/// connection to `greet` (the protocol's hello), retrying every 50 ms until `timeout` while
/// nobody listens there yet; `what` names the store in the time out's error. What `greet`
/// returns ends the attempts, its error included.
pub(crate) fn dial<T>(
    addr: &str,
    timeout: Duration,
    what: &str,
    mut greet: impl FnMut(std::net::TcpStream, std::net::SocketAddr) -> Result<T>,
) -> Result<T> {
    use std::net::ToSocketAddrs;
    let deadline = crate::sync::deadline_after(timeout);
    let mut last = String::from("no address");
    loop {
        let addrs: Vec<std::net::SocketAddr> = match addr.to_socket_addrs() {
            Ok(a) => a.collect(),
            Err(e) => {
                last = format!("cannot resolve it: {e}");
                Vec::new()
            }
        };
        for a in addrs {
            let left = deadline.saturating_duration_since(Instant::now());
            match std::net::TcpStream::connect_timeout(&a, left.max(Duration::from_millis(1))) {
                Ok(s) => return greet(s, a),
                Err(e) => last = format!("{a}: {e}"),
            }
        }
        if Instant::now() >= deadline {
            return Err(Error::StoreTimeout {
                what: format!("a connection to {what} at {addr} ({last})"),
                waited_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A shared store is a store.
impl<S: Store + ?Sized> Store for Arc<S> {
    fn set(&self, key: &str, value: Vec<u8>) -> Result<()> {
        (**self).set(key, value)
    }
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        (**self).get(key, timeout)
    }
    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        (**self).add(key, delta)
    }
    fn compare_set(&self, key: &str, expected: &[u8], desired: Vec<u8>) -> Result<Vec<u8>> {
        (**self).compare_set(key, expected, desired)
    }
    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        (**self).wait(keys, timeout)
    }
    fn check(&self, keys: &[&str]) -> Result<bool> {
        (**self).check(keys)
    }
    fn delete(&self, key: &str) -> Result<bool> {
        (**self).delete(key)
    }
    fn num_keys(&self) -> Result<u64> {
        (**self).num_keys()
    }
}

/// `add` on a map: torch's rules (an unset key is 0; the value is its decimal text).
pub(crate) fn add_in(map: &mut HashMap<String, Vec<u8>>, key: &str, delta: i64) -> Result<i64> {
    let cur = match map.get(key) {
        None => 0,
        Some(v) => std::str::from_utf8(v)
            .ok()
            .and_then(|s| s.parse::<i64>().ok())
            .ok_or_else(|| Error::invalid(format!("store: value of {key} is not an integer")))?,
    };
    // torch's TCPStore wraps (C++ signed overflow); a counter that wraps silently would
    // hand out a value already given, so the call fails and the value stays.
    let new = cur.checked_add(delta).ok_or_else(|| {
        Error::invalid(format!(
            "store: adding {delta} to {key} ({cur}) overflows a 64-bit integer"
        ))
    })?;
    map.insert(key.to_owned(), new.to_string().into_bytes());
    Ok(new)
}

/// `compare_set` on a map: torch's rules (see [`Store::compare_set`]).
pub(crate) fn compare_set_in(
    map: &mut HashMap<String, Vec<u8>>,
    key: &str,
    expected: &[u8],
    desired: Vec<u8>,
) -> Vec<u8> {
    let swap = match map.get(key) {
        None => expected.is_empty(),
        Some(cur) => cur.as_slice() == expected,
    };
    if swap {
        map.insert(key.to_owned(), desired.clone());
        return desired;
    }
    map.get(key).cloned().unwrap_or_else(|| expected.to_vec())
}

/// The key-value table behind [`MemoryStore`] and [`TcpStoreServer`]: torch's semantics,
/// with waiters woken when a key changes.
#[derive(Default)]
pub(crate) struct Table {
    map: Mutex<HashMap<String, Vec<u8>>>,
    changed: Condvar,
}

impl Table {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<u8>>> {
        lock(&self.map)
    }

    /// Waits until `f` finds what it wants in the map, for at most `timeout`.
    fn wait_for<T>(
        &self,
        timeout: Duration,
        what: &str,
        mut f: impl FnMut(&HashMap<String, Vec<u8>>) -> Option<T>,
    ) -> Result<T> {
        let deadline = crate::sync::deadline_after(timeout);
        let mut map = self.lock();
        loop {
            if let Some(v) = f(&map) {
                return Ok(v);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::StoreTimeout {
                    what: what.to_string(),
                    waited_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
                });
            }
            map = self
                .changed
                .wait_timeout(map, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }

    pub(crate) fn set(&self, key: &str, value: Vec<u8>) {
        self.lock().insert(key.to_owned(), value);
        self.changed.notify_all();
    }

    pub(crate) fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.wait_for(timeout, key, |m| m.get(key).cloned())
    }

    /// The value of `key` now, if it is set.
    pub(crate) fn value(&self, key: &str) -> Option<Vec<u8>> {
        self.lock().get(key).cloned()
    }

    /// Appends `more` to the value of `key` (an unset key starts empty): torch's `append`.
    pub(crate) fn append(&self, key: &str, more: &[u8]) {
        self.lock()
            .entry(key.to_owned())
            .or_default()
            .extend_from_slice(more);
        self.changed.notify_all();
    }

    pub(crate) fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let new = add_in(&mut self.lock(), key, delta)?;
        self.changed.notify_all();
        Ok(new)
    }

    pub(crate) fn compare_set(&self, key: &str, expected: &[u8], desired: Vec<u8>) -> Vec<u8> {
        let now = compare_set_in(&mut self.lock(), key, expected, desired);
        self.changed.notify_all();
        now
    }

    pub(crate) fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        let missing = |m: &HashMap<String, Vec<u8>>| -> Vec<&str> {
            keys.iter()
                .copied()
                .filter(|k| !m.contains_key(*k))
                .collect()
        };
        let what = || {
            let m = self.lock();
            missing(&m).join(", ")
        };
        self.wait_for(timeout, "", |m| missing(m).is_empty().then_some(()))
            .map_err(|e| match e {
                // Name the keys still missing, not all of them.
                Error::StoreTimeout { waited_ms, .. } => Error::StoreTimeout {
                    what: what(),
                    waited_ms,
                },
                e => e,
            })
    }

    /// Whether every key is set within `timeout` (a [`wait`](Self::wait) that builds no
    /// error: torch's server waits in short turns).
    pub(crate) fn wait_until(&self, keys: &[&str], timeout: Duration) -> bool {
        self.wait_for(timeout, "", |m| {
            keys.iter().all(|k| m.contains_key(*k)).then_some(())
        })
        .is_ok()
    }

    pub(crate) fn check(&self, keys: &[&str]) -> bool {
        let m = self.lock();
        keys.iter().all(|k| m.contains_key(*k))
    }

    pub(crate) fn delete(&self, key: &str) -> bool {
        let gone = self.lock().remove(key).is_some();
        self.changed.notify_all();
        gone
    }

    pub(crate) fn num_keys(&self) -> u64 {
        self.lock().len() as u64
    }
}

/// A store in memory, shared by reference (`Arc<MemoryStore>`) between in-process ranks.
#[derive(Default)]
pub struct MemoryStore {
    table: Table,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }
}

impl Store for MemoryStore {
    fn set(&self, key: &str, value: Vec<u8>) -> Result<()> {
        self.table.set(key, value);
        Ok(())
    }
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.table.get(key, timeout)
    }
    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        self.table.add(key, delta)
    }
    fn compare_set(&self, key: &str, expected: &[u8], desired: Vec<u8>) -> Result<Vec<u8>> {
        Ok(self.table.compare_set(key, expected, desired))
    }
    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        self.table.wait(keys, timeout)
    }
    fn check(&self, keys: &[&str]) -> Result<bool> {
        Ok(self.table.check(keys))
    }
    fn delete(&self, key: &str) -> Result<bool> {
        Ok(self.table.delete(key))
    }
    fn num_keys(&self) -> Result<u64> {
        Ok(self.table.num_keys())
    }
}

/// torch's `PrefixStore`: every key of `inner` seen through it is `PREFIX/key`, so that
/// several users (groups, jobs, retries) share one store without colliding. `num_keys`
/// counts the whole inner store, as torch's does.
pub struct PrefixStore {
    prefix: String,
    inner: Arc<dyn Store>,
}

impl PrefixStore {
    /// `inner` seen under `prefix`.
    pub fn new(prefix: impl Into<String>, inner: Arc<dyn Store>) -> Self {
        PrefixStore {
            prefix: prefix.into(),
            inner,
        }
    }

    fn key(&self, k: &str) -> String {
        format!("{}/{k}", self.prefix)
    }
}

impl Store for PrefixStore {
    fn set(&self, key: &str, value: Vec<u8>) -> Result<()> {
        self.inner.set(&self.key(key), value)
    }
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.inner.get(&self.key(key), timeout)
    }
    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        self.inner.add(&self.key(key), delta)
    }
    fn compare_set(&self, key: &str, expected: &[u8], desired: Vec<u8>) -> Result<Vec<u8>> {
        self.inner.compare_set(&self.key(key), expected, desired)
    }
    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        let full: Vec<String> = keys.iter().map(|k| self.key(k)).collect();
        let refs: Vec<&str> = full.iter().map(String::as_str).collect();
        self.inner.wait(&refs, timeout)
    }
    fn check(&self, keys: &[&str]) -> Result<bool> {
        let full: Vec<String> = keys.iter().map(|k| self.key(k)).collect();
        let refs: Vec<&str> = full.iter().map(String::as_str).collect();
        self.inner.check(&refs)
    }
    fn delete(&self, key: &str) -> Result<bool> {
        self.inner.delete(&self.key(key))
    }
    fn num_keys(&self) -> Result<u64> {
        self.inner.num_keys()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// torch's store semantics, for any store (the TCP store's tests run it too).
    pub(crate) fn semantics(s: &dyn Store) {
        semantics_refusing(s, |e| matches!(e, Error::InvalidArgument(_)));
    }

    /// [`semantics`], where an `add` to a value that is not an integer fails as `refused`
    /// says (torch's protocol has no error answer: its server closes the connection).
    pub(crate) fn semantics_refusing(s: &dyn Store, refused: fn(&Error) -> bool) {
        let short = Duration::from_millis(20);
        assert_eq!(s.num_keys(), Ok(0));
        assert_eq!(s.check(&["a"]), Ok(false));
        s.set("a", b"1".to_vec()).unwrap_or(());
        assert_eq!(s.get("a", short), Ok(b"1".to_vec()));
        assert_eq!(s.check(&["a"]), Ok(true));
        assert_eq!(s.add("n", 2), Ok(2));
        assert_eq!(s.add("n", -5), Ok(-3));
        assert!(
            matches!(s.add("a", 1), Ok(2)),
            "a's value \"1\" is an integer"
        );
        s.set("text", b"x".to_vec()).unwrap_or(());
        let not_integer = s.add("text", 1);
        assert!(not_integer.as_ref().is_err_and(refused), "{not_integer:?}");
        // compare_set: torch's rules.
        assert_eq!(s.compare_set("c", b"", b"v1".to_vec()), Ok(b"v1".to_vec()));
        assert_eq!(
            s.compare_set("c", b"no", b"v2".to_vec()),
            Ok(b"v1".to_vec())
        );
        assert_eq!(
            s.compare_set("c", b"v1", b"v2".to_vec()),
            Ok(b"v2".to_vec())
        );
        assert_eq!(
            s.compare_set("unset", b"e", b"d".to_vec()),
            Ok(b"e".to_vec())
        );
        assert_eq!(s.check(&["unset"]), Ok(false));
        assert_eq!(s.num_keys(), Ok(4));
        assert_eq!(s.delete("c"), Ok(true));
        assert_eq!(s.delete("c"), Ok(false));
        assert_eq!(s.num_keys(), Ok(3));
        // Timeouts name what was missing.
        assert_eq!(
            s.get("missing", short),
            Err(Error::StoreTimeout {
                what: "missing".into(),
                waited_ms: 20
            })
        );
        assert_eq!(
            s.wait(&["a", "rank/3", "rank/4"], short),
            Err(Error::StoreTimeout {
                what: "rank/3, rank/4".into(),
                waited_ms: 20
            })
        );
        assert_eq!(s.wait(&["a", "n"], short), Ok(()));
        // An empty value is a value.
        s.set("empty", Vec::new()).unwrap_or(());
        assert_eq!(s.get("empty", short), Ok(Vec::new()));
    }

    #[test]
    fn the_memory_store_has_torch_semantics() {
        semantics(&MemoryStore::new());
    }

    #[test]
    fn a_prefix_store_is_a_namespace() {
        let inner: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let a = PrefixStore::new("job1", inner.clone());
        let b = PrefixStore::new("job2", inner.clone());
        a.set("addr", b"x".to_vec()).unwrap_or(());
        assert_eq!(inner.get("job1/addr", Duration::ZERO), Ok(b"x".to_vec()));
        assert!(b.get("addr", Duration::from_millis(5)).is_err());
        assert_eq!(a.add("n", 1), Ok(1));
        assert_eq!(b.add("n", 5), Ok(5));
        assert_eq!(a.check(&["addr", "n"]), Ok(true));
        assert_eq!(b.check(&["addr"]), Ok(false));
    }

    #[test]
    fn get_waits_for_set() {
        let s = Arc::new(MemoryStore::new());
        let s2 = s.clone();
        let t = std::thread::spawn(move || s2.get("addr", Duration::from_secs(5)));
        s.set("addr", b"127.0.0.1:29500".to_vec()).unwrap_or(());
        assert_eq!(
            t.join().ok().and_then(Result::ok),
            Some(b"127.0.0.1:29500".to_vec())
        );
    }
}
