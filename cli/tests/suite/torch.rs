//! collectix with torch itself: Rust ranks whose store is a Python process's `TCPStore`, torch's
//! clients of a collectix store (`collectix store --torch`) rendezvousing a Gloo group through
//! it, and the README's example under a real torchrun, on one node and as two nodes.
//!
//! They need a Python with torch: `COLLECTIX_TORCH_PYTHON`, else `python3` if it imports
//! torch (`.ci/run` installs torch from PyPI in a virtual environment). Without one they say
//! SKIPPED, and fail under CI.

use crate::common;

use collectix::{GroupOptions, InitArgs, ReduceOp, Store, StoreProtocol, Tensor, TorchStore};
use common::{assert_runs_the_example, example, free_port};
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The Python with torch, or `None` (SKIPPED; under CI a failure).
fn torch_python() -> Option<PathBuf> {
    let candidates: Vec<PathBuf> = std::env::var_os("COLLECTIX_TORCH_PYTHON")
        .map(PathBuf::from)
        .into_iter()
        .chain([PathBuf::from("python3")])
        .collect();
    let found = candidates.into_iter().find(|py| {
        Command::new(py)
            .args(["-c", "import torch.distributed"])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "no Python with torch in CI: .ci/run installs it (COLLECTIX_TORCH_PYTHON)"
        );
        eprintln!(
            "SKIPPED: no Python with torch here (set COLLECTIX_TORCH_PYTHON to one, e.g. a \
             virtual environment's bin/python with `pip install torch`)"
        );
    }
    found
}

/// torchrun beside that Python.
fn torchrun(py: &std::path::Path) -> Command {
    let beside = py.parent().map(|d| d.join("torchrun"));
    match beside {
        Some(t) if t.exists() => Command::new(t),
        _ => {
            let mut c = Command::new(py);
            c.args(["-m", "torch.distributed.run"]);
            c
        }
    }
}

/// torchrun starting 4 processes of `exe` on this node, with a store port of its own and
/// torchrun's flags `more`; the port.
fn torchrun_four(py: &std::path::Path, more: &[&str], exe: &std::path::Path) -> (Command, String) {
    let port = free_port().to_string();
    let mut c = torchrun(py);
    c.args(["--nproc-per-node", "4", "--master-port", &port])
        .args(more)
        .arg("--no-python")
        .arg(exe)
        .env("OMP_NUM_THREADS", "1");
    (c, port)
}

/// Rank `r` of `w` joining through the store at 127.0.0.1:`port`, which someone else serves
/// in torch's protocol.
fn torch_store_args(port: u16, r: usize, w: usize) -> InitArgs {
    InitArgs {
        init_method: Some(format!("tcp://127.0.0.1:{port}")),
        rank: Some(r),
        world_size: Some(w),
        launcher_store: Some(true),
        store_protocol: Some(StoreProtocol::Torch),
        ..InitArgs::default()
    }
}

fn script(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/torch")
        .join(name)
}

/// What a child printed, once it ended (killed if it runs past `within`), and whether it
/// succeeded.
fn finish(mut child: Child, within: Duration) -> (bool, String, String) {
    let deadline = Instant::now() + within;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                break None;
            }
        }
    };
    let mut so = String::new();
    let mut se = String::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_string(&mut so);
    }
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut se);
    }
    (status.is_some_and(|s| s.success()), so, se)
}

/// Starts each command with its outputs piped, and [`finish`]es them all.
fn run_all(
    cmds: impl IntoIterator<Item = Command>,
    within: Duration,
) -> Vec<(bool, String, String)> {
    let children: Vec<Child> = cmds
        .into_iter()
        .map(|mut c| {
            c.stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| panic!("{e}"))
        })
        .collect();
    children.into_iter().map(|c| finish(c, within)).collect()
}

#[test]
fn rust_ranks_join_a_job_whose_store_a_python_process_serves() {
    let Some(py) = torch_python() else { return };
    let w = 3usize;
    let mut python = Command::new(&py)
        .arg(script("mixed.py"))
        .arg(w.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    let mut out = BufReader::new(python.stdout.take().unwrap_or_else(|| panic!("no stdout")));
    let mut first = String::new();
    out.read_line(&mut first).unwrap_or(0);
    let port: u16 = first
        .trim()
        .strip_prefix("port ")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("the Python side said {first:?}"));
    let addr = format!("127.0.0.1:{port}");
    let results: Vec<Result<f32, String>> = std::thread::scope(|s| {
        let ranks: Vec<_> = (0..w)
            .map(|r| {
                s.spawn(move || -> Result<f32, String> {
                    let args = torch_store_args(port, r, w);
                    let p =
                        collectix::init(&args, GroupOptions::default(), Duration::from_secs(30))
                            .map_err(|e| e.to_string())?;
                    let said = p
                        .store()
                        .get("from_python", Duration::from_secs(10))
                        .map_err(|e| e.to_string())?;
                    if said != b"hello from torch" {
                        return Err(format!("from_python is {said:?}"));
                    }
                    p.store().add("rust_ranks", 1).map_err(|e| e.to_string())?;
                    let t = Tensor::from_vec(vec![r as f32 + 1.0]);
                    let sum = p
                        .communicator()
                        .all_reduce(t, ReduceOp::Sum)
                        .wait()
                        .map_err(|e| e.to_string())?;
                    let v = sum.to_vec::<f32>().map_err(|e| e.to_string())?[0];
                    p.shutdown().map_err(|e| e.to_string())?;
                    Ok(v)
                })
            })
            .collect();
        ranks
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("panicked".into())))
            .collect()
    });
    let done = TorchStore::connect(addr, Duration::from_secs(10))
        .and_then(|s| s.set("rust_done", b"yes".to_vec()));
    python.stdout = Some(out.into_inner());
    let (ok, so, se) = finish(python, Duration::from_secs(60));
    assert_eq!(results, vec![Ok(6.0); w], "python said:\n{so}\n{se}");
    assert_eq!(done, Ok(()));
    assert!(ok, "{so}\n{se}");
    assert_eq!(
        so.lines().collect::<Vec<_>>(),
        [
            "rust ranks counted: 3",
            "rank 0's address published: True",
            "rust done: yes"
        ],
        "{se}"
    );
}

#[test]
fn torchs_clients_rendezvous_a_gloo_group_through_collectix_store() {
    let Some(py) = torch_python() else { return };
    let port = free_port();
    let mut server = Command::new(env!("CARGO_BIN_EXE_collectix"))
        .args(["store", "--torch", "--port", &port.to_string()])
        .env_remove("COLLECTIX_SECRET")
        .env_remove("COLLECTIX_SECRET_FILE")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    let mut line = String::new();
    BufReader::new(server.stdout.take().unwrap_or_else(|| panic!("no stdout")))
        .read_line(&mut line)
        .unwrap_or(0);
    assert!(line.contains("(torch's clients too)"), "{line:?}");
    let addr = format!("127.0.0.1:{port}");
    let ours = collectix::TcpStore::connect(addr.clone(), Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{e}"));
    ours.set("from_rust", b"hello from rust".to_vec())
        .unwrap_or_else(|e| panic!("{e}"));
    let clients = (0..2).map(|r| {
        let mut c = Command::new(&py);
        c.arg(script("client.py"))
            .args([port.to_string(), r.to_string()]);
        c
    });
    let outs = run_all(clients, Duration::from_secs(60));
    for (r, (ok, so, se)) in outs.iter().enumerate() {
        assert!(ok, "rank {r}:\n{so}\n{se}");
        assert!(
            so.contains(&format!("rank {r}: all_reduce 3.0")),
            "rank {r}:\n{so}\n{se}"
        );
    }
    assert!(
        outs[0].1.contains(
            "get hello from rust; add 5; compare_set first then first; check True False; \
             delete True"
        ),
        "{}\n{}",
        outs[0].1,
        outs[0].2
    );
    assert_eq!(
        ours.get("from_python", Duration::ZERO),
        Ok(b"hello from torch".to_vec())
    );
    assert_eq!(ours.get("count", Duration::ZERO), Ok(b"5".to_vec()));
    let _ = server.kill();
    let _ = server.wait();
}

#[test]
fn the_readme_example_runs_under_torchrun() {
    let Some(py) = torch_python() else { return };
    let (mut cmd, _) = torchrun_four(&py, &[], &example("all_reduce"));
    assert_runs_the_example(&mut cmd, false);
}

#[test]
fn the_readme_example_runs_as_two_torchrun_nodes() {
    let Some(py) = torch_python() else { return };
    let endpoint = format!("127.0.0.1:{}", free_port());
    let exe = example("all_reduce");
    let nodes = (0..2).map(|n| {
        let mut c = torchrun(&py);
        c.args(["--nnodes", "2", "--nproc-per-node", "2"])
            .args(["--rdzv-backend", "c10d", "--rdzv-endpoint", &endpoint])
            .args([
                "--rdzv-id",
                "collectix-two-nodes",
                "--node-rank",
                &n.to_string(),
            ])
            .arg("--no-python")
            .arg(&exe)
            .env("OMP_NUM_THREADS", "1");
        c
    });
    let outs = run_all(nodes, Duration::from_secs(120));
    let so: String = outs.iter().map(|o| o.1.as_str()).collect();
    let se: String = outs.iter().map(|o| o.2.as_str()).collect();
    assert!(outs.iter().all(|o| o.0), "{so}\n{se}");
    common::assert_example_lines(&so, false, &se);
}

#[test]
fn a_rank_told_the_wrong_store_protocol_under_torchrun_says_so_in_one_line() {
    let Some(py) = torch_python() else { return };
    let (mut cmd, port) = torchrun_four(&py, &[], &example("all_reduce"));
    let out = cmd
        .env("COLLECTIX_STORE_PROTOCOL", "collectix")
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let se = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{se}");
    let want = format!(
        "Error: store: 127.0.0.1:{port}: it speaks torch's TCPStore protocol, not collectix's: \
         set COLLECTIX_STORE_PROTOCOL=torch"
    );
    // torchrun stops the other ranks once one has failed: some may not have come so far.
    let said = se.lines().filter(|l| l.starts_with(&want)).count();
    assert!(said >= 1, "no rank said it:\n{se}");
    // Each on a line of its own, whole (the ranks share one stderr).
    let errors = se.lines().filter(|l| l.starts_with("Error:")).count();
    assert_eq!(said, errors, "{se}");
    assert!(!se.contains("Error: Error:"), "{se}");
}

/// The `rank R: final loss … params …` lines of the elastic example's output, sorted.
fn final_lines(out: &str) -> Vec<String> {
    let mut v: Vec<String> = out
        .lines()
        .filter(|l| l.contains(": final loss "))
        .map(str::to_string)
        .collect();
    v.sort();
    v
}

#[test]
fn a_rank_killed_under_torchrun_max_restarts_ends_as_a_run_without_the_fault() {
    let Some(py) = torch_python() else { return };
    let exe = example("elastic");
    let run = |fault: &[&str]| {
        let (mut cmd, _) = torchrun_four(&py, &["--max-restarts", "1"], &exe);
        let out = cmd
            .args(["--steps", "30", "--step-ms", "5"])
            .args(fault)
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        let so = String::from_utf8_lossy(&out.stdout).into_owned();
        let se = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{so}\n{se}");
        (so, se)
    };
    let (clean, _) = run(&[]);
    let (faulty, se) = run(&["--crash-rank", "1", "--crash-at-step", "10"]);
    assert!(
        se.contains("rank 1: crashing at step 10, as asked"),
        "the fault never happened:\n{faulty}\n{se}"
    );
    let want = final_lines(&clean);
    assert_eq!(want.len(), 4, "{clean}");
    assert_eq!(final_lines(&faulty), want, "{faulty}\n{se}");
}

#[test]
fn collectix_status_asks_a_job_over_torchs_store_protocol() {
    // Needs no torch: the store is collectix's, open to torch's clients, and the ranks speak
    // torch's protocol to it.
    let server = collectix::TcpStoreServer::open_to_torch(
        "127.0.0.1:0",
        collectix::Security::loopback_only(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let port = server.local_addr().port();
    let w = 3usize;
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let rx = std::sync::Mutex::new(rx);
    std::thread::scope(|s| {
        for r in 0..w {
            let rx = &rx;
            s.spawn(move || {
                let args = torch_store_args(port, r, w);
                let p = collectix::init(&args, GroupOptions::default(), Duration::from_secs(20))
                    .unwrap_or_else(|e| panic!("{e}"));
                let c = p.communicator();
                c.barrier().wait().unwrap_or_else(|e| panic!("{e}"));
                // Rank 2 stays behind until the test has looked.
                if r == 2 {
                    let _ = rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
                }
                c.barrier().wait().unwrap_or_else(|e| panic!("{e}"));
                p.shutdown().unwrap_or_else(|e| panic!("{e}"));
            });
        }
        // Asked until every rank answers as it stands (they may still be joining): rank 2
        // behind, the others waiting in the second barrier.
        let want = "group world: behind call #1: rank 2 (at #0, completed)";
        let deadline = Instant::now() + Duration::from_secs(30);
        let (so, se) = loop {
            let out = Command::new(env!("CARGO_BIN_EXE_collectix"))
                .args(["status", "--torch", "--master-port", &port.to_string()])
                .output()
                .unwrap_or_else(|e| panic!("{e}"));
            let so = String::from_utf8_lossy(&out.stdout).into_owned();
            let se = String::from_utf8_lossy(&out.stderr).into_owned();
            if (out.status.success() && so.contains(want)) || Instant::now() > deadline {
                break (so, se);
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let _ = tx.send(());
        assert!(so.contains(want), "{so}\n{se}");
    });
}
