//! `Process::builder`: a service says its rank, the world's size, the store, the secret and
//! its address in code, with no launcher and no variable, and joins a job; what it leaves out
//! or gets wrong is a clear error before anything is joined.

use crate::common;

use collectix::{Error, Launcher, Process, ReduceOp, Rendezvous, Secret, Tensor, Transport};
use common::free_port;
use std::time::Duration;

fn secret() -> Secret {
    Secret::new("the builder tests' secret").unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn three_services_join_from_code_alone_and_all_reduce() {
    let port = free_port();
    let ranks: Vec<_> = (0..3)
        .map(|r| {
            std::thread::spawn(move || -> Result<Vec<f32>, Error> {
                let p = Process::builder()
                    .rank(r)
                    .world_size(3)
                    .store(format!("127.0.0.1:{port}"))
                    .secret(secret())
                    .address("127.0.0.1")
                    .transport(Transport::Tcp)
                    .ignore_environment()
                    .timeout(Duration::from_secs(60))
                    .init()?;
                assert_eq!(p.communicator().rank(), r);
                assert_eq!(p.config().launcher, Launcher::Explicit);
                assert_eq!(p.address().split(':').next(), Some("127.0.0.1"));
                let sum = p
                    .communicator()
                    .all_reduce(Tensor::from_vec(vec![r as f32 + 1.0; 4]), ReduceOp::Sum)
                    .wait()?
                    .to_vec::<f32>()?;
                p.shutdown()?;
                Ok(sum)
            })
        })
        .collect();
    for t in ranks {
        let got = t.join().unwrap_or_else(|_| panic!("a rank panicked"));
        assert_eq!(got, Ok(vec![6.0; 4]));
    }
}

#[test]
fn what_the_builder_leaves_out_or_gets_wrong_is_named_before_joining() {
    let quick = Duration::from_millis(300);
    let invalid = |b: collectix::ProcessBuilder, names: &str| match b
        .timeout(quick)
        .ignore_environment()
        .init()
    {
        Err(Error::InvalidArgument(m)) => assert!(m.contains(names), "{m:?} names no {names}"),
        Err(other) => panic!("{other:?}: not an InvalidArgument naming {names}"),
        Ok(_) => panic!("joined a job with settings naming {names}"),
    };
    invalid(Process::builder().rank(0), "world size");
    invalid(Process::builder().world_size(2), "rank");
    invalid(
        Process::builder()
            .rank(2)
            .world_size(2)
            .store("127.0.0.1:1"),
        "not below the world size",
    );
    invalid(
        Process::builder()
            .rank(0)
            .world_size(1)
            .store("no-port-here"),
        "tcp://HOST:PORT",
    );
    invalid(Process::builder().rank(0).world_size(1), "MASTER_ADDR");
    let port = free_port();
    invalid(
        Process::builder()
            .rank(0)
            .world_size(1)
            .store(format!("127.0.0.1:{port}"))
            .interface("no-such-if0"),
        "no-such-if0",
    );
}

#[test]
fn the_config_is_what_was_given_and_the_environment_fills_in_only_when_asked() {
    let b = Process::builder()
        .rank(1)
        .world_size(4)
        .store("tcp://[fd00::2]:29400");
    let c = b
        .clone()
        .ignore_environment()
        .config()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (c.rank, c.world_size, c.launcher),
        (1, 4, Launcher::Explicit)
    );
    assert_eq!(
        c.rendezvous,
        Rendezvous::Tcp {
            host: "fd00::2".into(),
            port: 29400
        }
    );
    let f = Process::builder()
        .rank(0)
        .world_size(1)
        .store_file("/shared/job7/store")
        .ignore_environment()
        .config()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        f.rendezvous,
        Rendezvous::File {
            path: "/shared/job7/store".into()
        }
    );
    assert_eq!(b.args().world_size, Some(4));
}
