//! Where a call was made and who made it, for the rule that one thread at a time issues a
//! group's calls (`collectix_runtime::issuers`).
//!
//! The public methods that issue calls are `#[track_caller]`; the first one entered on a
//! thread notes its caller's location here for as long as it runs ([`enter`]), and taking a
//! sequence number reads it ([`here`]). The issuer is the async task the call is made in
//! (tokio's task id: a task may move between threads between its calls), or else the
//! thread.

use std::cell::Cell;
use std::panic::Location;

thread_local! {
    /// The location noted by the outermost public method running on this thread.
    static SITE: Cell<Option<&'static Location<'static>>> = const { Cell::new(None) };
    /// A byte whose address names this thread while it lives.
    static THREAD: u8 = const { 0 };
}

/// A public method's note of its caller's location, taken back when dropped.
pub(crate) struct Entered(bool);

/// Notes the caller's location for the calls made until the guard drops, unless a method
/// entered before on this thread noted one (the user's call is the outermost).
#[track_caller]
pub(crate) fn enter() -> Entered {
    let here = Location::caller();
    Entered(SITE.with(|s| {
        let first = s.get().is_none();
        if first {
            s.set(Some(here));
        }
        first
    }))
}

impl Drop for Entered {
    fn drop(&mut self) {
        if self.0 {
            SITE.with(|s| s.set(None));
        }
    }
}

/// The location of the user's call being made on this thread, if a public method noted one.
pub(crate) fn here() -> Option<&'static Location<'static>> {
    SITE.with(Cell::get)
}

/// The issuer of a call made now: the async task's id, else this thread's (never 0).
pub(crate) fn issuer() -> u64 {
    match tokio::task::try_id() {
        Some(id) => {
            use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
            BuildHasherDefault::<DefaultHasher>::default().hash_one(id) | 1
        }
        // Even: a byte's address, aligned to at least 2 only by chance; shifted so that it
        // is never odd (task ids are) and never 0.
        None => THREAD.with(|b| (std::ptr::from_ref(b) as u64) << 1) | 2,
    }
}

/// The issuer in words, for an error naming it.
pub(crate) fn who() -> String {
    let t = std::thread::current();
    let thread = match t.name() {
        Some(n) => format!("thread '{n}'"),
        None => format!("thread {:?}", t.id()),
    };
    match tokio::task::try_id() {
        Some(id) => format!("task {id} on {thread}"),
        None => thread,
    }
}
