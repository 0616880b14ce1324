//! The simulator's seeded randomness and its network and failure-detection model.

use std::time::Duration;

/// SplitMix64: a small, good-enough seeded generator (no dependency).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator with `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    /// Uniform in `0..=max`, to the nanosecond.
    pub fn up_to(&mut self, max: Duration) -> Duration {
        let n = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX);
        if n == 0 {
            return Duration::ZERO;
        }
        Duration::from_nanos(self.next_u64() % n.saturating_add(1).max(1))
    }
}

/// The order in which messages in flight are delivered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Delivery {
    /// In order of delivery time (send time, latency, jitter, delay); ties broken at random.
    /// Virtual time is consistent, so time bounds can be checked.
    #[default]
    Timed,
    /// Like [`Timed`](Delivery::Timed), but each link delivers in the order it was sent on
    /// (a message is never delivered before one sent earlier on its link), as TCP and
    /// in-process channels do: what guarantees that rest on FIFO links are checked here.
    Fifo,
    /// Any message in flight, picked at random: every interleaving is possible, but the clock
    /// only follows the picks, so time bounds do not hold.
    AnyOrder,
}

/// The network and failure-detection model of a [`Sim`](super::Sim).
#[derive(Clone, Debug, PartialEq)]
pub struct SimOptions {
    /// How deliveries are ordered.
    pub delivery: Delivery,
    /// The latency every message has.
    pub latency: Duration,
    /// Each message gets an extra latency uniform in `0..=jitter`.
    pub jitter: Duration,
    /// Per mille of messages that are delayed, in addition, by up to
    /// [`max_delay`](Self::max_delay).
    pub delayed_per_mille: u32,
    /// The longest extra delay of a delayed message.
    pub max_delay: Duration,
    /// How long after [`Sim::isolate`](super::Sim::isolate) the other ranks learn the rank is
    /// lost.
    pub detect_after: Duration,
    /// Each observer learns of an isolation up to this much later than
    /// [`detect_after`](Self::detect_after) (seeded, per observer).
    pub detect_jitter: Duration,
    /// Per mille of send attempts on which a rank's link to a peer says "would block": the
    /// message waits in the link's [`Outbox`](crate::wire::link::Outbox), in order, and is
    /// retried one latency later. Capped at 999 (a link that never takes anything would never
    /// deliver).
    pub would_block_per_mille: u32,
}

impl Default for SimOptions {
    /// 10 µs latency, up to 5 µs jitter, one message in ten delayed by up to 200 µs, timed
    /// delivery, isolation detected after one latency, links that would block on one send
    /// attempt in ten.
    fn default() -> Self {
        SimOptions {
            delivery: Delivery::Timed,
            latency: Duration::from_micros(10),
            jitter: Duration::from_micros(5),
            delayed_per_mille: 100,
            max_delay: Duration::from_micros(200),
            detect_after: Duration::from_micros(10),
            detect_jitter: Duration::ZERO,
            would_block_per_mille: 100,
        }
    }
}

impl SimOptions {
    /// With another delivery order.
    pub fn with_delivery(mut self, delivery: Delivery) -> Self {
        self.delivery = delivery;
        self
    }

    /// With another detection delay and jitter for [`Sim::isolate`](super::Sim::isolate).
    pub fn with_detection(mut self, after: Duration, jitter: Duration) -> Self {
        self.detect_after = after;
        self.detect_jitter = jitter;
        self
    }
}
