//! The differential set recorded from torch.distributed (Gloo), run on every path: what torch
//! gave each rank for 2,547 collectives (every collective, W = 2, 3 and 4, 1, 5 and 300
//! elements, nine dtypes, every op collectix and Gloo share) is what collectix gives, byte
//! for byte, on the engine and on the board in the simulator and in one process, between
//! ranks over shared memory, and over TCP.
//!
//! The set is `tests/torch_reference/gloo.txt`, recorded by `tests/torch_reference/record.py`
//! (its doc has the format, the inputs and the command); torch need not be installed here.

use crate::common;

use collectix::runtime::board::BoardCall;
use collectix::runtime::testing::input;
use collectix::runtime::testing::sim::Sim;
use collectix::runtime::Output;
use collectix::{CallOptions, Communicator, DType, GroupId, ReduceOp, Request, Tensor};
use collectix::{OpKind, TensorSpec};
use std::sync::Mutex;
use std::time::Duration;

const SET: &str = include_str!("../torch_reference/gloo.txt");
const TIMEOUT: Duration = Duration::from_secs(30);

/// One recorded case: the call, and each rank's output as torch gave it.
#[derive(Debug)]
struct Recorded {
    kind: OpKind,
    w: usize,
    count: usize,
    dtype: DType,
    op: ReduceOp,
    root: usize,
    /// Per rank: `-` (no output), `?` (unspecified by torch), or tensors (`SHAPE:FNV`).
    outputs: Vec<String>,
    line: usize,
}

fn field<'a>(words: &mut impl Iterator<Item = &'a str>, key: &str) -> Result<&'a str, String> {
    let w = words.next().ok_or_else(|| format!("no {key}"))?;
    w.strip_prefix(key)
        .and_then(|v| v.strip_prefix('='))
        .ok_or_else(|| format!("{w}: not {key}=…"))
}

fn kind(s: &str) -> Result<OpKind, String> {
    Ok(match s {
        "all_reduce" => OpKind::AllReduce,
        "reduce" => OpKind::Reduce,
        "broadcast" => OpKind::Broadcast,
        "all_gather" => OpKind::AllGather,
        "all_gather_into_tensor" => OpKind::AllGatherIntoTensor,
        "gather" => OpKind::Gather,
        "scatter" => OpKind::Scatter,
        "reduce_scatter" => OpKind::ReduceScatter,
        "reduce_scatter_tensor" => OpKind::ReduceScatterTensor,
        "all_to_all" => OpKind::AllToAll,
        "all_to_all_single" => OpKind::AllToAllSingle,
        other => return Err(format!("kind {other}")),
    })
}

fn dtype(s: &str) -> Result<DType, String> {
    Ok(match s {
        "f32" => DType::F32,
        "f64" => DType::F64,
        "f16" => DType::F16,
        "bf16" => DType::BF16,
        "i32" => DType::I32,
        "i64" => DType::I64,
        "i8" => DType::I8,
        "u8" => DType::U8,
        "bool" => DType::Bool,
        other => return Err(format!("dtype {other}")),
    })
}

fn op(s: &str) -> Result<ReduceOp, String> {
    Ok(match s {
        "sum" => ReduceOp::Sum,
        "product" => ReduceOp::Product,
        "min" => ReduceOp::Min,
        "max" => ReduceOp::Max,
        "avg" => ReduceOp::Avg,
        "band" => ReduceOp::BAnd,
        "bor" => ReduceOp::BOr,
        "bxor" => ReduceOp::BXor,
        other => return Err(format!("op {other}")),
    })
}

fn parse_line(line: &str, n: usize) -> Result<Recorded, String> {
    let (head, outs) = line.split_once(" : ").ok_or("no ' : '")?;
    let mut words = head.split(' ');
    let kind = kind(words.next().ok_or("empty")?)?;
    let num = |v: &str| v.parse::<usize>().map_err(|e| format!("{v}: {e}"));
    let w = num(field(&mut words, "w")?)?;
    let count = num(field(&mut words, "count")?)?;
    let dtype = dtype(field(&mut words, "dtype")?)?;
    let op = op(field(&mut words, "op")?)?;
    let root = num(field(&mut words, "root")?)?;
    let mut outputs = Vec::new();
    for (r, o) in outs.split(' ').enumerate() {
        let v = o
            .strip_prefix(&format!("r{r}="))
            .ok_or_else(|| format!("{o}: not r{r}=…"))?;
        outputs.push(v.to_string());
    }
    if outputs.len() != w {
        return Err(format!("{} outputs for {w} ranks", outputs.len()));
    }
    Ok(Recorded {
        kind,
        w,
        count,
        dtype,
        op,
        root,
        outputs,
        line: n,
    })
}

/// The recorded set, for a world of `w`.
fn recorded(w: usize) -> Vec<Recorded> {
    let all: Vec<Recorded> = SET
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.starts_with('#') && !l.trim().is_empty())
        .map(|(i, l)| parse_line(l, i + 1).unwrap_or_else(|e| panic!("gloo.txt:{}: {e}", i + 1)))
        .collect();
    assert!(all.len() >= 2_500, "the set has {} cases", all.len());
    all.into_iter().filter(|c| c.w == w).collect()
}

/// The request rank `r` makes in case `c`: the inputs `record.py` gave torch.
fn request(c: &Recorded, r: usize) -> Request {
    let (w, n, dt) = (c.w, c.count, c.dtype);
    let inp = |salt: usize, n: usize| input(dt, c.op, r, salt, n);
    let spec = |n: usize| TensorSpec::new(&[n], dt);
    let block = |j: usize| n + j % 2;
    let a2a = |from: usize, to: usize| n + (from + 2 * to) % 3;
    match c.kind {
        OpKind::AllReduce => Request::AllReduce {
            tensor: inp(0, n),
            op: c.op,
        },
        OpKind::Reduce => Request::Reduce {
            tensor: inp(0, n),
            root: c.root,
            op: c.op,
        },
        OpKind::Broadcast => Request::Broadcast {
            tensor: if r == c.root {
                inp(0, n)
            } else {
                Tensor::zeros(&[n], dt).unwrap_or_else(|e| panic!("{e}"))
            },
            root: c.root,
        },
        OpKind::AllGather => Request::AllGather {
            input: inp(0, n),
            outputs: vec![spec(n); w],
        },
        OpKind::AllGatherIntoTensor => Request::AllGatherIntoTensor {
            input: inp(0, n),
            output: TensorSpec::new(&[w, n], dt),
        },
        OpKind::Gather => Request::Gather {
            input: inp(0, n),
            root: c.root,
        },
        OpKind::Scatter => Request::Scatter {
            output: spec(n),
            inputs: (r == c.root).then(|| (0..w).map(|j| inp(j, n)).collect()),
            root: c.root,
        },
        OpKind::ReduceScatter => Request::ReduceScatter {
            inputs: (0..w).map(|j| inp(j, block(j))).collect(),
            op: c.op,
        },
        OpKind::ReduceScatterTensor => Request::ReduceScatterTensor {
            input: inp(0, n * w),
            output: spec(n),
            op: c.op,
        },
        OpKind::AllToAll => Request::AllToAll {
            inputs: (0..w).map(|j| inp(j, n)).collect(),
            outputs: vec![spec(n); w],
        },
        OpKind::AllToAllSingle => {
            let ins: Vec<usize> = (0..w).map(|j| a2a(r, j)).collect();
            let outs: Vec<usize> = (0..w).map(|j| a2a(j, r)).collect();
            Request::AllToAllSingle {
                input: inp(0, ins.iter().sum()),
                output: spec(outs.iter().sum()),
                output_splits: Some(outs),
                input_splits: Some(ins),
            }
        }
        other => panic!("no request for {other}"),
    }
}

/// 64-bit FNV-1a, as `record.py` hashes a tensor's bytes.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn show(t: &Tensor) -> String {
    let shape: Vec<String> = t.shape().iter().map(ToString::to_string).collect();
    format!("{}:{:016x}", shape.join("x"), fnv(t.bytes()))
}

fn encode(o: &Output) -> String {
    match o {
        Output::None => "-".into(),
        Output::Tensor(t) => show(t),
        Output::Tensors(ts) => format!("[{}]", ts.iter().map(show).collect::<Vec<_>>().join(",")),
        other => format!("{other:?}"),
    }
}

/// Whether rank `r`'s result of `c` is torch's; a line to report if not.
fn check(c: &Recorded, r: usize, got: collectix::Result<Output>, path: &str) -> Option<String> {
    let want = &c.outputs[r];
    let got = match got {
        Ok(o) => encode(&o),
        Err(e) => format!("error: {e}"),
    };
    (want != "?" && *want != got).then(|| {
        format!(
            "{path}: gloo.txt:{} {:?} w={} count={} {:?} {:?} root={}: rank {r} got {got}, torch {want}",
            c.line, c.kind, c.w, c.count, c.dtype, c.op, c.root
        )
    })
}

/// Runs every case of a world on rank `r` of `comm`, one after the other, as every rank
/// does; `opts` picks each call's options; `shared`: every input a tensor in shared memory.
fn run_rank(
    comm: &Communicator,
    r: usize,
    cases: &[Recorded],
    path: &str,
    opts: impl Fn(usize, &Recorded) -> CallOptions,
    shared: bool,
) -> Vec<String> {
    let mut wrong = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let mut req = request(c, r);
        if shared {
            let to_heap = |t: Tensor| {
                let s = comm.to_shared(&t)?;
                if t.numel() > 0 && !comm.is_shared(&s) {
                    wrong.push(format!("{path}: rank {r}: an input not in the heap"));
                }
                Ok(s)
            };
            req = match req.try_map(to_heap, |s| s) {
                Ok(req) => req,
                Err(e) => panic!("{path}: rank {r}: to_shared: {e}"),
            };
        }
        let got = comm
            .submit(req, &opts(i, c))
            .wait_timeout(TIMEOUT)
            .unwrap_or_else(|| panic!("{path}: rank {r}: no result for gloo.txt:{}", c.line));
        wrong.extend(check(c, r, got, path));
    }
    wrong
}

fn assert_none(wrong: Vec<String>) {
    let n = wrong.len();
    let first: Vec<&String> = wrong.iter().take(20).collect();
    assert!(
        wrong.is_empty(),
        "{n} outputs differ from torch's:\n{first:#?}"
    );
}

/// One process, every rank a thread: on the engine (each call forcing one of its kind's
/// algorithms, in turn) or on the default path (the board for the small all_reduce,
/// broadcast and reduce calls).
fn in_one_process(w: usize, engine: bool) {
    let cases = recorded(w);
    let path = if engine { "engine" } else { "default" };
    let opts = |i: usize, c: &Recorded| {
        let mut o = CallOptions::default();
        if engine {
            let algs = c.kind.algorithms();
            o.algorithm = Some(algs[i % algs.len()]);
        }
        o
    };
    let wrong = common::on_every_rank(w, TIMEOUT, |comm| {
        let wrong = run_rank(comm, comm.rank(), &cases, path, opts, false);
        if wrong.is_empty() {
            Ok(())
        } else {
            Err(wrong.join("\n"))
        }
    });
    assert_none(wrong.into_iter().filter_map(Result::err).collect());
}

/// Processes' ranks over `transport` (threads of this process, each joining the job); with
/// `shared`, every input a tensor in the rank's shared heap (`Communicator::to_shared`).
fn in_a_job(w: usize, transport: collectix::Transport, shared: bool) {
    let cases = recorded(w);
    let path = format!(
        "{transport:?}{}",
        if shared { " on shared tensors" } else { "" }
    );
    let wrong = Mutex::new(Vec::new());
    let ends = common::job(
        transport,
        w,
        "the torch differential's secret",
        TIMEOUT,
        |r, p| {
            let c = p.communicator();
            let got = run_rank(c, r, &cases, &path, |_, _| CallOptions::default(), shared);
            if let Ok(mut all) = wrong.lock() {
                all.extend(got);
            }
            p.shutdown().map_err(|e| e.to_string())
        },
    );
    for (r, e) in ends.into_iter().enumerate() {
        assert!(e.is_ok(), "rank {r}: {e:?}");
    }
    assert_none(wrong.into_inner().unwrap_or_default());
}

/// Every case in the seeded simulator, with boards on or off; how many calls ran on a board.
fn in_the_simulator(boards: bool) -> usize {
    let mut wrong = Vec::new();
    let mut on_board = 0;
    for w in [2, 3, 4] {
        for (i, c) in recorded(w).iter().enumerate() {
            let mut sim = Sim::new(w, i as u64);
            if boards {
                sim = sim.with_boards();
            }
            let ids: Vec<_> = (0..w)
                .map(|r| {
                    let req = request(c, r);
                    let info = sim
                        .group(r, GroupId::WORLD)
                        .unwrap_or_else(|e| panic!("{e}"));
                    let opts = CallOptions::default();
                    on_board += usize::from(boards && BoardCall::of(&req, &info, &opts).is_some());
                    sim.submit(r, GroupId::WORLD, req, &opts)
                        .unwrap_or_else(|e| panic!("gloo.txt:{}: rank {r}: {e}", c.line))
                })
                .collect();
            sim.run_no_timeouts(1_000_000)
                .unwrap_or_else(|e| panic!("gloo.txt:{}: {e:?}", c.line));
            for (r, id) in ids.into_iter().enumerate() {
                let got = sim
                    .take(r, id)
                    .unwrap_or_else(|| panic!("gloo.txt:{}: rank {r} has no result", c.line));
                let path = if boards {
                    "simulator, boards on"
                } else {
                    "simulator"
                };
                wrong.extend(check(c, r, got, path));
            }
        }
    }
    assert_none(wrong);
    on_board
}

#[test]
fn torch_outputs_on_the_engine_in_the_simulator() {
    assert_eq!(in_the_simulator(false), 0);
}

#[test]
fn torch_outputs_on_the_board_and_engine_in_the_simulator() {
    let n = in_the_simulator(true);
    assert!(n >= 1_000, "only {n} calls ran on a board");
}

#[test]
fn torch_outputs_on_the_engine_in_one_process() {
    for w in [2, 3, 4] {
        in_one_process(w, true);
    }
}

#[test]
fn torch_outputs_on_the_board_and_engine_in_one_process() {
    for w in [2, 3, 4] {
        in_one_process(w, false);
    }
}

#[test]
fn torch_outputs_over_shared_memory() {
    for w in [2, 3, 4] {
        in_a_job(w, collectix::Transport::Shm, false);
    }
}

#[test]
fn torch_outputs_over_tcp() {
    for w in [2, 3, 4] {
        in_a_job(w, collectix::Transport::Tcp, false);
    }
}

/// Every input a tensor in shared memory (each checked to be in the rank's heap). The set's
/// payloads (at most 300 elements) cross inline; those read out of a peer's heap are the
/// fault matrix's and the job check's (`tests/suite/fault_matrix.rs`, `tests/suite/tcp_world.rs`).
#[test]
fn torch_outputs_over_shared_memory_on_shared_tensors() {
    for w in [2, 3, 4] {
        in_a_job(w, collectix::Transport::Shm, true);
    }
}
