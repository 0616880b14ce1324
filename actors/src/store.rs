//! Key-value stores for rendezvous (c10d's `Store`): ranks that do not share memory find each
//! other through one. In-memory now; TCP and file stores come with the multi-process world.

use collectix_runtime::{Error, Result};
use std::collections::HashMap;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// c10d's `Store`: `set`, blocking `get`, atomic `add`, `wait`.
pub trait Store: Send + Sync {
    /// Sets `key` to `value`.
    fn set(&self, key: &str, value: Vec<u8>) -> Result<()>;
    /// The value of `key`, waiting up to `timeout` for it to be set.
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>>;
    /// Adds `delta` to the integer at `key` (0 if unset) and returns the new value.
    fn add(&self, key: &str, delta: i64) -> Result<i64>;
    /// Waits up to `timeout` until every key is set.
    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()>;
}

/// A store in memory, shared by reference (`Arc<MemoryStore>`) between in-process ranks.
#[derive(Default)]
pub struct MemoryStore {
    map: Mutex<HashMap<String, Vec<u8>>>,
    changed: Condvar,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn wait_for<T>(
        &self,
        timeout: Duration,
        what: &str,
        mut f: impl FnMut(&HashMap<String, Vec<u8>>) -> Option<T>,
    ) -> Result<T> {
        let deadline = Instant::now() + timeout;
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
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
}

impl Store for MemoryStore {
    fn set(&self, key: &str, value: Vec<u8>) -> Result<()> {
        self.map
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.to_owned(), value);
        self.changed.notify_all();
        Ok(())
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.wait_for(timeout, key, |m| m.get(key).cloned())
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let cur = match map.get(key) {
            None => 0,
            Some(v) => std::str::from_utf8(v)
                .ok()
                .and_then(|s| s.parse::<i64>().ok())
                .ok_or_else(|| {
                    Error::invalid(format!("store: value of {key} is not an integer"))
                })?,
        };
        let new = cur.wrapping_add(delta);
        map.insert(key.to_owned(), new.to_string().into_bytes());
        drop(map);
        self.changed.notify_all();
        Ok(new)
    }

    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        self.wait_for(timeout, &keys.join(", "), |m| {
            keys.iter().all(|k| m.contains_key(*k)).then_some(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn get_waits_for_set_and_add_counts() {
        let s = Arc::new(MemoryStore::new());
        let s2 = s.clone();
        let t = std::thread::spawn(move || s2.get("addr", Duration::from_secs(5)));
        s.set("addr", b"127.0.0.1:29500".to_vec()).unwrap_or(());
        assert_eq!(
            t.join().ok().and_then(Result::ok),
            Some(b"127.0.0.1:29500".to_vec())
        );
        assert_eq!(s.add("n", 2).ok(), Some(2));
        assert_eq!(s.add("n", 3).ok(), Some(5));
        // A key that never comes is a store timeout naming it, not the caller's fault.
        assert_eq!(
            s.get("missing", Duration::from_millis(5)),
            Err(Error::StoreTimeout {
                what: "missing".into(),
                waited_ms: 5
            })
        );
        assert!(s.wait(&["addr", "n"], Duration::from_millis(5)).is_ok());
        assert!(matches!(
            s.wait(&["addr", "rank/3"], Duration::from_millis(5)),
            Err(Error::StoreTimeout { what, .. }) if what == "addr, rank/3"
        ));
    }
}
