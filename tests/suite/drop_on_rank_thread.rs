//! Dropping a `World` from one of its own rank threads (here: a waker that the rank calls
//! when a call completes) never hangs (it used to deadlock the process forever).

use collectix::{ReduceOp, Tensor, World};
use std::future::Future;
use std::pin::Pin;
use std::sync::{mpsc, Arc, Mutex};
use std::task::{Context, Wake, Waker};
use std::time::Duration;

struct DropWorld {
    world: Mutex<Option<World>>,
    done: Mutex<Option<mpsc::Sender<std::thread::ThreadId>>>,
}

impl Wake for DropWorld {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        let w = self.world.lock().ok().and_then(|mut g| g.take());
        drop(w); // on the rank's thread
        if let Some(tx) = self.done.lock().ok().and_then(|mut g| g.take()) {
            let _ = tx.send(std::thread::current().id());
        }
    }
}

#[test]
fn dropping_a_world_on_its_own_rank_thread_returns() {
    let world = World::local(2).unwrap_or_else(|e| panic!("{e}"));
    let c0 = world.communicators()[0].clone();
    let c1 = world.communicators()[1].clone();
    let (tx, rx) = mpsc::channel();
    let waker_state = Arc::new(DropWorld {
        world: Mutex::new(Some(world)),
        done: Mutex::new(Some(tx)),
    });
    let waker = Waker::from(waker_state.clone());
    let mut work = c0.all_reduce(Tensor::from_vec(vec![1.0f32]), ReduceOp::Sum);
    // Registered while pending: the rank wakes it when rank 1 joins.
    assert!(Pin::new(&mut work)
        .poll(&mut Context::from_waker(&waker))
        .is_pending());
    let other = c1.all_reduce(Tensor::from_vec(vec![2.0f32]), ReduceOp::Sum);
    let thread = rx
        .recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|_| panic!("the drop hung"));
    assert_ne!(
        thread,
        std::thread::current().id(),
        "the waker ran on a rank thread"
    );
    // Calls made through handles that outlive the world fail; they do not hang.
    let _ = other
        .wait_timeout(Duration::from_secs(30))
        .unwrap_or_else(|| panic!("hung"));
    let late = c1.all_reduce(Tensor::from_vec(vec![2.0f32]), ReduceOp::Sum);
    assert!(late
        .wait_timeout(Duration::from_secs(30))
        .unwrap_or_else(|| panic!("hung"))
        .is_err());
}
