//! [`FastMap`]: a `HashMap` with a multiply-rotate hasher (FxHash's), for the engine's maps
//! that are looked up on every message and every call. SipHash, the standard hasher, resists
//! collision attacks but costs more than the rest of a small call's lookup; these maps are
//! only ever filled with keys this rank chose (its calls, its groups, its peers, the
//! receives its schedule expects), so a peer cannot flood them with colliding keys. Maps a
//! peer's messages insert into keep SipHash.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A `HashMap` keyed by this rank's own ids, hashed with [`FastHasher`].
pub type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;

/// FxHash's word-at-a-time multiply-rotate hasher (as in rustc): a few cycles per key.
#[derive(Clone, Copy, Debug, Default)]
pub struct FastHasher(u64);

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FastHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for FastHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(w));
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_that_differ_hash_apart_and_the_map_finds_them() {
        let mut m: FastMap<(usize, u32), u64> = FastMap::default();
        for src in 0..64 {
            for tag in 0..64u32 {
                m.insert((src, tag), (src as u64) << 32 | u64::from(tag));
            }
        }
        assert_eq!(m.len(), 64 * 64);
        assert_eq!(m.get(&(63, 7)), Some(&(63 << 32 | 7)));
        let h = |k: u64| {
            let mut x = FastHasher::default();
            x.write_u64(k);
            x.finish()
        };
        assert_ne!(h(1), h(2));
        assert_ne!(
            h(1) >> 57,
            h(2) >> 57,
            "the top bits (hashbrown's tags) differ too"
        );
    }
}
