//! Metrics through the [`metrics`] facade: the application installs a recorder (Prometheus,
//! OpenTelemetry, …) and collectix reports to it; without one, nothing is measured, and a
//! call pays one look at the facade's recorder (a thread-local and an atomic load).
//!
//! | name | kind | labels | what |
//! |---|---|---|---|
//! | `collectix_calls_total` | counter | `op`, `group` | calls whose result was taken (awaited, waited for), failed ones included |
//! | `collectix_call_bytes_total` | counter | `op`, `group` | bytes the calls declared: inputs and output specs |
//! | `collectix_call_seconds` | histogram | `op`, `group` | from issue to the result's taking |
//! | `collectix_call_errors_total` | counter | `op`, `group`, `kind` | failed calls, by [`Error::kind_name`] |
//! | `collectix_peers_lost_total` | counter | | peers this process's ranks lost (a connection broken or silent, a link cut) |
//! | `collectix_connections_refused_total` | counter | `listener` (`store`, `link`), `reason` | connections closed in their handshake (`handshake`) or beyond the gate's limits (`limit`) |
//! | `collectix_late_calls_total` | counter | `group`, `rank`, `peer` | the group's calls in which rank `rank` (its group rank) saw member `peer` come last by 10 ms or more (`Communicator::lateness`; `peer` may be `rank`) |
//! | `collectix_peer_lateness_seconds` | gauge | `group`, `rank`, `peer` | how late `peer` came to the last call it came last in, as rank `rank` saw it |
//!
//! `op` is torch's name of the call (`all_reduce`, `send`, …); `group` is the group's id
//! (`world` for the world). A call is counted when its result is taken, on the thread that
//! takes it: a `Work` dropped unawaited is not counted. Counted: every `Communicator`
//! collective and point-to-point call (host or device), the buffers API, the object
//! collectives (as `broadcast_object_list`, `all_gather_object`, `gather_object`,
//! `scatter_object_list`: one call each, its bytes this rank's encoded objects), the calls
//! that make groups (`new_group`, `new_subgroups`, `split`: no bytes, counted under the
//! parent group) and the recovery calls (`shrink`, `regrow`, `rejoin`, under the group they
//! leave). A call made of others counts once, as itself: the object collectives' sizes and
//! `split`'s gather are not counted on their own. Not counted: `revoke` (a message, not a
//! call with a result).
//!
//! Whether a recorder is installed is asked of the facade when a call is issued: a recorder
//! of zero size (the facade's no-op one) counts as none.
//!
//! The two lateness metrics are set, when a collective's result is taken, from the rank's
//! summary for the group (`collectix_runtime::lateness`): the counter to its absolute count,
//! the gauge to the member's most recent lateness; only members that came last are
//! reported.

use crate::rank::driver::Driver;
use collectix_runtime::lateness::LatenessSummary;
use collectix_runtime::{Error, GroupId, Request, Result};
use std::sync::Arc;
use std::time::Instant;

/// Whether a recorder is installed, for this thread (a local one) or globally.
fn recording() -> bool {
    metrics::with_recorder(|r| std::mem::size_of_val(r) != 0)
}

/// One call being measured: made when it is issued (only while a recorder is installed),
/// reported when its result is taken.
pub(crate) struct Probe {
    op: &'static str,
    group: GroupId,
    bytes: u64,
    start: Instant,
    /// The rank whose lateness summary of the group is reported with a collective.
    lateness: Option<Arc<Driver>>,
}

impl Probe {
    /// A probe for `req` on `group`, or `None` when nothing records.
    pub(crate) fn start(req: &Request, group: GroupId) -> Option<Box<Probe>> {
        if !recording() {
            return None;
        }
        Some(Probe::boxed(
            req.kind().name(),
            group,
            req.declared_bytes().unwrap_or(0),
        ))
    }

    /// [`start`](Self::start), and for a collective, the group's lateness as `driver`'s rank
    /// sees it reported with it.
    pub(crate) fn start_on(
        req: &Request,
        group: GroupId,
        driver: &Arc<Driver>,
    ) -> Option<Box<Probe>> {
        let mut p = Self::start(req, group)?;
        if !req.is_p2p() {
            p.lateness = Some(driver.clone());
        }
        Some(p)
    }

    /// A probe for a call that is not one request (an object collective, `new_group`,
    /// `split`, a recovery call), counted as `op` with `bytes`; `None` when nothing records.
    pub(crate) fn named(op: &'static str, group: GroupId, bytes: u64) -> Option<Box<Probe>> {
        recording().then(|| Probe::boxed(op, group, bytes))
    }

    fn boxed(op: &'static str, group: GroupId, bytes: u64) -> Box<Probe> {
        Box::new(Probe {
            op,
            group,
            bytes,
            start: Instant::now(),
            lateness: None,
        })
    }

    /// Reports the call, with its `result`.
    pub(crate) fn finish<T>(&self, result: &Result<T>) {
        let group = self.group.to_string();
        let labels = [("op", self.op.to_string()), ("group", group)];
        metrics::counter!("collectix_calls_total", &labels).increment(1);
        metrics::counter!("collectix_call_bytes_total", &labels).increment(self.bytes);
        metrics::histogram!("collectix_call_seconds", &labels)
            .record(self.start.elapsed().as_secs_f64());
        if let Err(e) = result {
            let [op, group] = labels;
            let with_kind = [op, group, ("kind", kind_of(e).to_string())];
            metrics::counter!("collectix_call_errors_total", &with_kind).increment(1);
        }
        if let Some((rank, s)) = self.lateness.as_ref().and_then(|d| d.lateness(self.group)) {
            lateness(self.group, rank, &s);
        }
    }
}

/// Reports the group's late-comers as its member `rank` saw them.
pub(crate) fn lateness(group: GroupId, rank: usize, s: &LatenessSummary) {
    for (peer, m) in s.members.iter().enumerate().filter(|(_, m)| m.last > 0) {
        let labels = [
            ("group", group.to_string()),
            ("rank", rank.to_string()),
            ("peer", peer.to_string()),
        ];
        metrics::counter!("collectix_late_calls_total", &labels).absolute(m.last);
        metrics::gauge!("collectix_peer_lateness_seconds", &labels).set(m.recent.as_secs_f64());
    }
}

/// The error's kind, through aborts (a call that failed because its group aborted counts
/// under what aborted it).
fn kind_of(e: &Error) -> &'static str {
    e.root_cause().kind_name()
}

/// A peer was lost.
pub(crate) fn peer_lost() {
    metrics::counter!("collectix_peers_lost_total").increment(1);
}

/// A listener (`store` or `link`: its handshake's context) closed a connection before it
/// passed: in its handshake (`handshake`) or beyond the gate's limits (`limit`).
pub(crate) fn refused(listener: &'static [u8], reason: &'static str) {
    let listener = std::str::from_utf8(listener).unwrap_or("listener");
    metrics::counter!(
        "collectix_connections_refused_total",
        "listener" => listener,
        "reason" => reason
    )
    .increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;
    use collectix_runtime::Tensor;

    /// Counts what it is given (a recorder of non-zero size, unlike the facade's no-op one).
    #[derive(Default)]
    struct Counting(std::sync::Mutex<Vec<String>>);

    impl metrics::Recorder for Counting {
        fn describe_counter(
            &self,
            _: metrics::KeyName,
            _: Option<metrics::Unit>,
            _: metrics::SharedString,
        ) {
        }
        fn describe_gauge(
            &self,
            _: metrics::KeyName,
            _: Option<metrics::Unit>,
            _: metrics::SharedString,
        ) {
        }
        fn describe_histogram(
            &self,
            _: metrics::KeyName,
            _: Option<metrics::Unit>,
            _: metrics::SharedString,
        ) {
        }
        fn register_counter(
            &self,
            key: &metrics::Key,
            _: &metrics::Metadata<'_>,
        ) -> metrics::Counter {
            crate::sync::lock(&self.0).push(key.name().to_string());
            metrics::Counter::noop()
        }
        fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
            metrics::Gauge::noop()
        }
        fn register_histogram(
            &self,
            key: &metrics::Key,
            _: &metrics::Metadata<'_>,
        ) -> metrics::Histogram {
            crate::sync::lock(&self.0).push(key.name().to_string());
            metrics::Histogram::noop()
        }
    }

    #[test]
    fn without_a_recorder_no_call_is_measured_and_with_one_each_is() {
        let req = Request::AllReduce {
            tensor: Tensor::from_vec(vec![1.0f32; 4]),
            op: collectix_runtime::ReduceOp::Sum,
        };
        assert!(!recording());
        assert!(Probe::start(&req, GroupId::WORLD).is_none());
        let r = Counting::default();
        metrics::with_local_recorder(&r, || {
            assert!(recording());
            let p = Probe::start(&req, GroupId::WORLD);
            assert_eq!(
                p.as_ref().map(|p| (p.op, p.bytes)),
                Some(("all_reduce", 16))
            );
            if let Some(p) = p {
                p.finish::<()>(&Err(Error::invalid("x")));
            }
        });
        assert_eq!(
            *crate::sync::lock(&r.0),
            [
                "collectix_calls_total",
                "collectix_call_bytes_total",
                "collectix_call_seconds",
                "collectix_call_errors_total"
            ]
        );
    }
}
