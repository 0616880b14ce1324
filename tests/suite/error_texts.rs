//! The error texts quoted in `docs/errors.md` ("When things go wrong"), made the way a user
//! would meet them: each case runs real ranks into a failure and checks that the text it gets
//! is, word for word, one the page quotes (so the page cannot drift from the code).

use crate::common;

use collectix::runtime::collective::Request;
use collectix::{
    CallOptions, DType, Error, GroupOptions, MemoryStore, ReduceOp, Store, Tensor, TensorSpec,
    World,
};
use std::time::Duration;

fn world(n: usize) -> World {
    let opts = GroupOptions {
        desync_grace: Duration::from_millis(200),
        ..GroupOptions::default()
    };
    World::local_with(n, opts).unwrap_or_else(|e| panic!("{e}"))
}

fn short(ms: u64) -> CallOptions {
    CallOptions {
        timeout: Some(Duration::from_millis(ms)),
        ..Default::default()
    }
}

/// Each case's name and the text a rank got.
fn texts() -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    let t = |e: Error| e.to_string();

    // Different counts: found by the first message. (Rank 1 calls first, so that its data
    // is there when rank 0 calls and rank 0 is the one that notices: which rank notices
    // depends on timing, and the text names the noticing rank first.)
    let w = world(2);
    let c = w.communicators();
    let b = c[1].all_reduce(Tensor::from_vec(vec![1i64, 2, 3]), ReduceOp::Sum);
    std::thread::sleep(Duration::from_millis(100));
    let a = c[0].all_reduce(Tensor::from_vec(vec![1i64, 2]), ReduceOp::Sum);
    let _ = b.wait();
    out.push(("mismatch", a.wait().err().map(t).unwrap_or_default()));
    drop(w);

    // A gather where the peer broadcasts: no message is exchanged, the desync report finds it.
    let w = world(2);
    let c = w.communicators();
    let x = Tensor::from_vec(vec![1.0f32; 4]);
    let a = c[0].submit(
        Request::Gather {
            input: x.clone(),
            root: 0,
        },
        &short(300),
    );
    let b = c[1].submit(Request::Broadcast { tensor: x, root: 0 }, &short(10_000));
    out.push(("desync", a.wait().err().map(t).unwrap_or_default()));
    out.push(("aborted", b.wait().err().map(t).unwrap_or_default()));
    drop(w);

    // A rank that never calls.
    let w = world(2);
    let c = w.communicators();
    let a = c[0].submit(
        Request::AllReduce {
            tensor: Tensor::from_vec(vec![1i64, 2]),
            op: ReduceOp::Sum,
        },
        &short(300),
    );
    out.push(("timeout", a.wait().err().map(t).unwrap_or_default()));
    drop(w);

    // all_to_all_single with splits that disagree: rank 0 splits evenly (2 rows each way),
    // rank 1 sends rank 0 one row and expects one back. (Rank 1 first, as above.)
    let w = world(2);
    let c = w.communicators();
    let spec = TensorSpec::new(&[4], DType::I32);
    let b = c[1].all_to_all_single(
        spec.clone(),
        Tensor::from_vec(vec![1i32; 4]),
        Some(vec![1, 3]),
        Some(vec![1, 3]),
    );
    std::thread::sleep(Duration::from_millis(100));
    let a = c[0].all_to_all_single(spec, Tensor::from_vec(vec![1i32; 4]), None, None);
    let _ = b.wait();
    out.push(("sizes", a.wait().err().map(t).unwrap_or_default()));
    drop(w);

    // monitored_barrier with rank 2 missing.
    let w = world(3);
    let c = w.communicators();
    let a = c[0].monitored_barrier(Duration::from_millis(300));
    let b = c[1].monitored_barrier(Duration::from_millis(300));
    out.push(("monitored", a.wait().err().map(t).unwrap_or_default()));
    out.push(("monitored-other", b.wait().err().map(t).unwrap_or_default()));
    // Rank 2 never called: its pending error comes out of the shutdown.
    out.push(("shutdown", w.shutdown().err().map(t).unwrap_or_default()));

    // A broadcast root finishes early; only the peer sees the counts differ.
    let w = world(2);
    let c = w.communicators();
    let _ = c[0].broadcast(Tensor::from_vec(vec![1i32, 2, 3]), 0).wait();
    let _ = c[1].broadcast(Tensor::from_vec(vec![0i32; 4]), 0).wait();
    out.push((
        "destroy",
        c[0].destroy().wait().err().map(t).unwrap_or_default(),
    ));
    drop(w);

    // Misuse.
    let w = world(2);
    let c = w.communicators();
    let b = c[1].broadcast(Tensor::from_vec(vec![1i32]), 0);
    let a = c[0].broadcast(Tensor::from_vec(vec![1i32]), 5);
    out.push(("invalid", a.wait().err().map(t).unwrap_or_default()));
    // The other rank's part of the same call.
    out.push(("call failed", b.wait().err().map(t).unwrap_or_default()));
    drop(w);

    // An executor whose waker panics.
    {
        use std::future::Future;
        use std::task::Context;
        let w = world(2);
        let c = w.communicators();
        let mut work = c[0].barrier();
        let waker = common::panicking_waker();
        let _ = Future::poll(
            std::pin::Pin::new(&mut work),
            &mut Context::from_waker(&waker),
        );
        let _ = c[1].barrier().wait();
        let got = work.wait_timeout(Duration::from_secs(30));
        out.push((
            "panic",
            got.and_then(Result::err).map(t).unwrap_or_default(),
        ));
    }

    // A revoke, a rank that left, and a rank left out of the survivors' group.
    let w = world(3);
    let c = w.communicators();
    let waiting = c[0].all_reduce(Tensor::from_vec(vec![1.0f32]), ReduceOp::Sum);
    let _ = c[1].revoke();
    out.push(("revoked", waiting.wait().err().map(t).unwrap_or_default()));
    drop(w);
    let w = world(2);
    let c = w.communicators();
    let _ = c[1].destroy().wait();
    let got = c[0].barrier().wait();
    out.push((
        "left",
        got.err()
            .map(|e| t(e.root_cause().clone()))
            .unwrap_or_default(),
    ));
    drop(w);
    let short_world = |n: usize| {
        World::local_with(
            n,
            GroupOptions::default().with_timeout(Duration::from_millis(200)),
        )
        .unwrap_or_else(|e| panic!("{e}"))
    };
    let w = short_world(3);
    let c = w.communicators();
    // Rank 1 is killed; rank 0 comes to the agreement (with rank 1 dead, a majority) and
    // decides at the timeout; rank 2 comes after.
    let _ = w.kill(1);
    let _ = c[0].shrink().wait();
    let late = c[2].shrink().wait();
    out.push(("left out", late.err().map(t).unwrap_or_default()));
    drop(w);
    // A cut link: its higher end is left out, told why.
    let w = short_world(3);
    let c = w.communicators();
    let _ = w.cut(1, 2);
    let shrinks: Vec<_> = c.iter().map(|c| c.shrink()).collect();
    let cut = common::wait_all(shrinks, 60).remove(2);
    out.push(("left out, a cut link", cut.err().map(t).unwrap_or_default()));
    drop(w);
    // Two of five come to the agreement; the three others never do.
    let w = short_world(5);
    let c = w.communicators();
    let two: Vec<_> = c[..2].iter().map(|c| c.shrink()).collect();
    let got = common::wait_all(two, 60).remove(0);
    out.push(("no majority", got.err().map(t).unwrap_or_default()));
    drop(w);

    // Two groups of both ranks: rank 0 calls on A, rank 1 on B; each waits for the other.
    let w = world(2);
    let c = w.communicators();
    let groups: Vec<_> = c.iter().map(|c| c.new_group(&[0, 1])).collect();
    let a: Vec<_> = common::wait_all(groups, 20)
        .into_iter()
        .flatten()
        .flatten()
        .collect();
    let groups: Vec<_> = c.iter().map(|c| c.new_group(&[0, 1])).collect();
    let b: Vec<_> = common::wait_all(groups, 20)
        .into_iter()
        .flatten()
        .flatten()
        .collect();
    let x = Tensor::from_vec(vec![1.0f32; 4]);
    let first = a[0].all_reduce_with(x.clone(), ReduceOp::Sum, &short(300));
    let second = b[1].all_reduce_with(x, ReduceOp::Sum, &short(10_000));
    out.push(("wait cycle", first.wait().err().map(t).unwrap_or_default()));
    out.push((
        "wait cycle, rank 1",
        second.wait().err().map(t).unwrap_or_default(),
    ));
    drop(w);

    let store = MemoryStore::new();
    out.push((
        "store",
        store
            .get("rank/3", Duration::from_millis(100))
            .err()
            .map(t)
            .unwrap_or_default(),
    ));
    out
}

#[test]
fn the_texts_in_the_docs_are_the_texts_users_get() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/errors.md"))
        .unwrap_or_default();
    let mut missing = Vec::new();
    for (name, text) in texts() {
        assert!(!text.is_empty(), "{name}: no error");
        if std::env::var_os("PRINT_ERROR_TEXTS").is_some() {
            println!("{name}:\n{text}\n");
        }
        if !doc.contains(&text) {
            missing.push(format!("{name}: {text}"));
        }
    }
    assert!(
        missing.is_empty(),
        "docs/errors.md does not quote:\n{}",
        missing.join("\n")
    );
}
