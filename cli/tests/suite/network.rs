//! Several hosts, made on one machine: each rank runs in a network namespace of
//! its own, with its own address, joined to the others by veth pairs on a bridge. The
//! collective matrix passes across them; a silent partition (one veth set down: no FIN, no
//! reset) fails every rank's pending call, naming the unreachable peer, within the link
//! timeout; added delay and loss raise no false alarm; two namespaces of two processes each
//! share memory inside and go hierarchical across.
//!
//! Making namespaces takes root (CI runs as root). Where they cannot be made the tests say so
//! and pass — except in CI (`CI` set), where that is a failure. What each test saw (the
//! namespaces, their addresses, each rank's address and outcome) is written to
//! `target/netns-evidence/`, which `.ci/run` prints.

use crate::common;
use common::{example, target_dir};
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Namespaces made by this process so far (each net gets its own names and subnet).
static NETS: AtomicUsize = AtomicUsize::new(0);

/// `ip` (or another command) with `args`; `Err` with what it printed.
fn sh(cmd: &str, args: &[&str]) -> Result<String, String> {
    let out: Output = Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| format!("{cmd}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{cmd} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// `n` network namespaces, each with one veth into a bridge in this namespace and an
/// address `10.213.K.(i+1)/24`. Removed when dropped.
struct Net {
    tag: String,
    n: usize,
    subnet: String,
    /// A bridge-family nftables table of ours, if one was made.
    nft: bool,
}

impl Net {
    fn ns(&self, i: usize) -> String {
        format!("{}n{i}", self.tag)
    }
    fn host_end(&self, i: usize) -> String {
        format!("{}h{i}", self.tag)
    }
    fn bridge(&self) -> String {
        format!("{}b", self.tag)
    }
    fn addr(&self, i: usize) -> String {
        format!("{}.{}", self.subnet, i + 1)
    }

    /// Makes the namespaces, or says why it cannot.
    fn create(n: usize) -> Result<Net, String> {
        let k = NETS.fetch_add(1, Ordering::SeqCst);
        let pid = std::process::id();
        let net = Net {
            tag: format!("cx{}{k}", pid % 10_000),
            n,
            subnet: format!("10.{}.{}", 200 + k % 50, pid % 250),
            nft: false,
        };
        let b = net.bridge();
        sh("ip", &["link", "add", &b, "type", "bridge"])?;
        sh("ip", &["link", "set", &b, "up"])?;
        for i in 0..n {
            let (ns, h, v) = (net.ns(i), net.host_end(i), format!("{}v{i}", net.tag));
            sh("ip", &["netns", "add", &ns])?;
            sh(
                "ip",
                &["link", "add", &h, "type", "veth", "peer", "name", &v],
            )?;
            sh("ip", &["link", "set", &v, "netns", &ns])?;
            sh("ip", &["link", "set", &h, "master", &b])?;
            sh("ip", &["link", "set", &h, "up"])?;
            let cidr = format!("{}/24", net.addr(i));
            sh("ip", &["-n", &ns, "addr", "add", &cidr, "dev", &v])?;
            sh("ip", &["-n", &ns, "link", "set", &v, "up"])?;
            sh("ip", &["-n", &ns, "link", "set", "lo", "up"])?;
        }
        Ok(net)
    }

    /// The namespaces, or `None` (with the reason printed) where they cannot be made and
    /// this is not CI.
    fn or_skip(n: usize) -> Option<Net> {
        match Net::create(n) {
            Ok(net) => Some(net),
            Err(why) => {
                assert!(
                    std::env::var_os("CI").is_none(),
                    "CI must make network namespaces (it runs as root): {why}"
                );
                eprintln!("SKIPPED: cannot make network namespaces here: {why}");
                None
            }
        }
    }

    /// `exe` as rank `r` of `w` in namespace `r`, joining through rank 0's address.
    fn rank(&self, r: usize, w: usize, exe: &std::path::Path, env: &[(&str, &str)]) -> Child {
        self.rank_in(r, r, w, exe, env)
    }

    /// `exe` as rank `r` of `w` in namespace `ns`, joining through namespace 0's address.
    fn rank_in(
        &self,
        ns: usize,
        r: usize,
        w: usize,
        exe: &std::path::Path,
        env: &[(&str, &str)],
    ) -> Child {
        self.rank_with(ns, r, w, exe, &[], env)
    }

    /// [`rank_in`](Net::rank_in), `exe` given `args`.
    fn rank_with(
        &self,
        ns: usize,
        r: usize,
        w: usize,
        exe: &std::path::Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Child {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns(ns)])
            .arg(exe)
            .args(args)
            .env("RANK", r.to_string())
            .env("WORLD_SIZE", w.to_string())
            .env("MASTER_ADDR", self.addr(0))
            .env("MASTER_PORT", "29500")
            .env_remove("COLLECTIX_SECRET_FILE")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            c.env(k, v);
        }
        c.spawn()
            .unwrap_or_else(|e| panic!("cannot start rank {r}: {e}"))
    }

    /// What `ip` says about the namespaces: the evidence that they exist.
    fn describe(&self) -> String {
        let mut s = format!(
            "ip netns list:\n{}",
            sh("ip", &["netns", "list"]).unwrap_or_else(|e| e)
        );
        for i in 0..self.n {
            let ns = self.ns(i);
            s += &format!(
                "ip -n {ns} -brief addr:\n{}",
                sh("ip", &["-n", &ns, "-brief", "addr"]).unwrap_or_else(|e| e)
            );
        }
        s
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        if self.nft {
            let _ = sh("nft", &["delete", "table", "bridge", &self.tag]);
        }
        for i in 0..self.n {
            let _ = sh("ip", &["netns", "del", &self.ns(i)]);
            let _ = sh("ip", &["link", "del", &self.host_end(i)]);
        }
        let _ = sh("ip", &["link", "del", &self.bridge()]);
    }
}

/// Writes what a test saw to `target/netns-evidence/NAME.txt` (and stderr).
fn evidence(name: &str, text: &str) {
    let dir = target_dir().join("netns-evidence");
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::write(dir.join(format!("{name}.txt")), text);
    eprintln!("{text}");
}

/// A fresh secret for one job (the ranks listen on addresses other hosts could reach).
fn secret() -> String {
    collectix::Secret::random_text().unwrap_or_else(|e| panic!("{e}"))
}

/// Waits for `c` at most `limit` (a hang guard), then kills it; its output and status.
fn finish(mut c: Child, limit: Duration) -> (String, Option<std::process::ExitStatus>) {
    let start = Instant::now();
    let status = loop {
        match c.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if start.elapsed() < limit => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = c.kill();
                let _ = c.wait();
                break None;
            }
        }
    };
    let mut out = String::new();
    if let Some(mut o) = c.stdout.take() {
        let _ = o.read_to_string(&mut out);
    }
    if let Some(mut e) = c.stderr.take() {
        let _ = e.read_to_string(&mut out);
    }
    (out, status)
}

#[test]
fn the_matrix_passes_across_three_network_namespaces() {
    let Some(net) = Net::or_skip(3) else { return };
    let exe = example("check_job");
    let key = secret();
    let ranks: Vec<Child> = (0..3)
        .map(|r| net.rank(r, 3, &exe, &[("COLLECTIX_SECRET", &key)]))
        .collect();
    let mut report = net.describe();
    let mut counts = Vec::new();
    for (r, c) in ranks.into_iter().enumerate() {
        let (out, status) = finish(c, Duration::from_secs(300));
        report += &format!("rank {r} ({status:?}):\n{out}");
        assert!(status.is_some_and(|s| s.success()), "rank {r}:\n{out}");
        // Each rank was reached at its own namespace's address.
        let at = format!("rank {r}: at {}:", net.addr(r));
        assert!(out.contains(&at), "rank {r}: no {at:?} in\n{out}");
        let n: usize = out
            .lines()
            .find_map(|l| {
                l.strip_prefix(&format!("rank {r}: "))?
                    .strip_suffix(" cases ok")?
                    .parse()
                    .ok()
            })
            .unwrap_or_else(|| panic!("rank {r} did not finish:\n{out}"));
        counts.push(n);
    }
    assert!(
        counts.iter().all(|&n| n == counts[0] && n > 12),
        "{counts:?}"
    );
    evidence("matrix", &report);
}

/// Two "hosts" (namespaces) of two processes each: the ranks of one namespace share memory
/// (one shared-memory peer each), the world is on several hosts (`Hosts`: its all_reduces go
/// hierarchical, reduced over shared memory inside each namespace, the leaders over TCP
/// across), and the matrix passes.
#[test]
fn two_hosts_of_two_processes_share_memory_inside_and_pass_the_matrix_across() {
    let Some(net) = Net::or_skip(2) else { return };
    let exe = example("check_job");
    let key = secret();
    let ranks: Vec<Child> = (0..4)
        .map(|r| net.rank_in(r / 2, r, 4, &exe, &[("COLLECTIX_SECRET", &key)]))
        .collect();
    let mut report = net.describe();
    for (r, c) in ranks.into_iter().enumerate() {
        let (out, status) = finish(c, Duration::from_secs(300));
        report += &format!("rank {r} ({status:?}):\n{out}");
        assert!(status.is_some_and(|s| s.success()), "rank {r}:\n{out}");
        let at = format!("rank {r}: at {}:", net.addr(r / 2));
        assert!(out.contains(&at), "rank {r}: no {at:?} in\n{out}");
        assert!(
            out.contains(", 1 shared-memory peers, locality Hosts"),
            "rank {r}:\n{out}"
        );
        assert!(out.contains(" cases ok"), "rank {r} did not finish:\n{out}");
    }
    evidence("hierarchy", &report);
}

/// The multiprocess example's ranks in the namespaces, looping all_reduces, each having said
/// where it is.
fn looping(net: &Net, w: usize, iters: &str) -> Vec<(Child, BufReader<std::process::ChildStdout>)> {
    let exe = example("multiprocess");
    let key = secret();
    (0..w)
        .map(|r| {
            let mut c = net.rank(r, w, &exe, &[("COLLECTIX_SECRET", &key), ("ITERS", iters)]);
            let out = BufReader::new(c.stdout.take().unwrap_or_else(|| panic!("no stdout")));
            (c, out)
        })
        .collect()
}

#[test]
fn a_silent_partition_fails_every_ranks_call_naming_the_unreachable_peer() {
    let Some(net) = Net::or_skip(3) else { return };
    let mut ranks = looping(&net, 3, "1000000000");
    let mut report = net.describe();
    for (r, (_, out)) in ranks.iter_mut().enumerate() {
        let mut first = String::new();
        let _ = out.read_line(&mut first);
        assert!(first.starts_with(&format!("rank {r}: pid ")), "{first:?}");
        report += &first;
    }
    // Running: now cut rank 2 off without a word (its veth goes down: no FIN, no reset).
    std::thread::sleep(Duration::from_millis(500));
    let cut = Instant::now();
    sh("ip", &["link", "set", &net.host_end(2), "down"]).unwrap_or_else(|e| panic!("{e}"));
    report += &format!("rank 2's veth {} set down\n", net.host_end(2));
    for (r, (c, mut out)) in ranks.into_iter().enumerate() {
        // A hang guard well above the bound (10 s of silence, then the call fails).
        let (_, status) = finish(c, Duration::from_secs(60));
        let took = cut.elapsed();
        let mut rest = String::new();
        let _ = out.read_to_string(&mut rest);
        report += &format!("rank {r}: ended {status:?} {took:.1?} after the cut: {rest}");
        assert!(status.is_some_and(|s| !s.success()), "rank {r}: {rest}");
        let named = if r == 2 {
            rest.contains("rank 0") || rest.contains("rank 1")
        } else {
            rest.contains("rank 2")
        };
        assert!(
            rest.contains(&format!("rank {r}: error:")) && named,
            "rank {r} does not name the unreachable peer: {rest:?}"
        );
        assert!(took < Duration::from_secs(30), "rank {r}: {took:?}");
    }
    evidence("partition", &report);
}

#[test]
fn delay_and_loss_raise_no_false_alarm() {
    let Some(mut net) = Net::or_skip(3) else {
        return;
    };
    let mut report = net.describe();
    // netem where the kernel has it; else 1 % loss (nftables) and a token bucket whose queue
    // delays bursts by up to 50 ms.
    let mut how = Vec::new();
    for i in 0..3 {
        let h = net.host_end(i);
        match sh(
            "tc",
            &[
                "qdisc", "add", "dev", &h, "root", "netem", "delay", "20ms", "loss", "1%",
            ],
        ) {
            Ok(_) => how.push(format!("{h}: netem delay 20ms loss 1%")),
            Err(netem) => {
                sh(
                    "tc",
                    &[
                        "qdisc", "add", "dev", &h, "root", "tbf", "rate", "20mbit", "burst",
                        "32kbit", "latency", "50ms",
                    ],
                )
                .unwrap_or_else(|e| panic!("neither netem ({netem}) nor tbf: {e}"));
                how.push(format!(
                    "{h}: no netem in this kernel ({netem}); tbf rate 20mbit latency 50ms"
                ));
            }
        }
    }
    if how.iter().any(|h| h.contains("tbf")) {
        let t = net.tag.clone();
        let chain = "{ type filter hook forward priority 0; }";
        let made = sh("nft", &["add", "table", "bridge", &t])
            .and_then(|_| sh("nft", &["add", "chain", "bridge", &t, "cxloss", chain]))
            .and_then(|_| {
                let ends = format!("{t}h*");
                sh(
                    "nft",
                    &[
                        "add", "rule", "bridge", &t, "cxloss", "iifname", &ends, "numgen",
                        "random", "mod", "100", "<", "1", "counter", "drop",
                    ],
                )
            });
        net.nft = true;
        match made {
            Ok(_) => how.push("nftables: 1% of the bridge's frames dropped at random".into()),
            Err(e) => {
                assert!(
                    std::env::var_os("CI").is_none(),
                    "CI needs nftables (.ci/run installs it): {e}"
                );
                // Delay alone is not what this test is for: say so, rather than pass.
                eprintln!(
                    "SKIPPED: no loss can be applied here (no netem in this kernel, and nftables: {e}); Debian: apt-get install nftables"
                );
                return;
            }
        }
    }
    report += &format!("impairment:\n{}\n", how.join("\n"));
    let ranks = looping(&net, 3, "3000");
    for (r, (c, mut out)) in ranks.into_iter().enumerate() {
        let (_, status) = finish(c, Duration::from_secs(300));
        let mut text = String::new();
        let _ = out.read_to_string(&mut text);
        report += &format!("rank {r}: {status:?}\n{text}");
        assert!(status.is_some_and(|s| s.success()), "rank {r}: {text}");
        assert!(
            text.contains(&format!("rank {r}: ok 3000")),
            "rank {r}: {text}"
        );
    }
    if net.nft {
        let counted = sh("nft", &["list", "table", "bridge", &net.tag]).unwrap_or_else(|e| e);
        report += &format!("what nftables dropped:\n{counted}");
        // The loss was real: some frames were dropped.
        let dropped: u64 = counted
            .split("counter packets ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        assert!(dropped > 0 || std::env::var_os("CI").is_none(), "{counted}");
        if dropped == 0 {
            eprintln!("SKIPPED: nftables dropped no frame, so no loss was tested:\n{counted}");
            return;
        }
    }
    evidence("impaired", &report);
}

/// A line a rank of a namespace job printed, and when.
struct Said {
    at: Instant,
    rank: usize,
    text: String,
    /// Whether it came on stderr (the log).
    log: bool,
}

/// A job's store (`collectix store`) in this namespace, at `addr` on the bridge, with the
/// job's secret `key`; stopped when dropped.
struct StoreServer {
    child: Child,
    port: u16,
}

impl StoreServer {
    fn start(addr: &str, key: &str) -> StoreServer {
        let port = common::free_port();
        let child = Command::new(env!("CARGO_BIN_EXE_collectix"))
            .args(["store", "--host", addr, "--port", &port.to_string()])
            .env("COLLECTIX_SECRET", key)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start the store: {e}"));
        let by = Instant::now() + Duration::from_secs(30);
        let mut child = child;
        while std::net::TcpStream::connect((addr, port)).is_err() {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("the store ended: {status}");
            }
            assert!(Instant::now() < by, "the store never listened");
            std::thread::sleep(Duration::from_millis(20));
        }
        StoreServer { child, port }
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `examples/elastic.rs` as `w` ranks, one per namespace, with `env` (the store's address
/// and the secret among it): every line any of them prints, as it comes, and the processes.
fn training(
    net: &Net,
    w: usize,
    args: &[&str],
    env: &[(&str, &str)],
) -> (Vec<Child>, std::sync::mpsc::Receiver<Said>) {
    let exe = example("elastic");
    let (tx, rx) = std::sync::mpsc::channel();
    let children = (0..w)
        .map(|r| {
            let mut c = net.rank_with(r, r, w, &exe, args, env);
            let out = c.stdout.take().unwrap_or_else(|| panic!("no stdout"));
            let err = c.stderr.take().unwrap_or_else(|| panic!("no stderr"));
            let lines = |from: Box<dyn Read + Send>, log: bool| {
                let tx = tx.clone();
                std::thread::spawn(move || {
                    for text in BufReader::new(from).lines().map_while(Result::ok) {
                        let at = Instant::now();
                        let _ = tx.send(Said {
                            at,
                            rank: r,
                            text,
                            log,
                        });
                    }
                });
            };
            lines(Box::new(out), false);
            lines(Box::new(err), true);
            c
        })
        .collect();
    (children, rx)
}

/// Connections made on a link's first message (`COLLECTIX_CONNECT=lazy`), four ranks in
/// namespaces of their own training (`examples/elastic.rs`, shrinking on a failure): rank
/// `v`'s veth goes down (its links and its store connection silent, and no new connection
/// made either) until the others went on, and once they agree, another rank `k` is killed.
/// Few ranks had a connection to `v`, and fewer are left to say that theirs broke: the rest
/// probe it while they agree, and go on without waiting for it to come back. Only `v` is
/// left out, told its link broke (once its veth is up again); each survivor's first error
/// names `v` (or `k`), and they finish with the final line of a run without faults. The
/// store is served apart (`collectix store` on the bridge, as a launcher serves it), so
/// that every rank can be cut off or killed.
#[test]
fn with_lazy_connections_a_rank_cut_off_is_the_one_left_out() {
    let Some(net) = Net::or_skip(4) else { return };
    let here = format!("{}.254", net.subnet);
    sh(
        "ip",
        &["addr", "add", &format!("{here}/24"), "dev", &net.bridge()],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let key = secret();
    // A store of its own for each job.
    let job = || {
        let store = StoreServer::start(&here, &key);
        let port = store.port.to_string();
        let env: Vec<(&'static str, String)> = vec![
            ("COLLECTIX_SECRET", key.clone()),
            ("MASTER_ADDR", here.clone()),
            ("MASTER_PORT", port),
            ("TORCHELASTIC_USE_AGENT_STORE", "True".into()),
            ("COLLECTIX_STORE_PROTOCOL", "collectix".into()),
            ("COLLECTIX_CONNECT", "lazy".into()),
            ("COLLECTIX_TRANSPORT", "tcp".into()),
            ("COLLECTIX_LINK_TIMEOUT", "1.5".into()),
            ("COLLECTIX_TIMEOUT", "20".into()),
        ];
        (store, env)
    };
    let args = ["--steps", "40", "--step-ms", "10"];
    let limit = Duration::from_secs(60);
    let final_line = |text: &str| text.contains(": final loss ");
    // The clean run's final line (rank 0's; the others say the same with their number).
    let clean = {
        let (_store, env) = job();
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let (children, rx) = training(&net, 4, &args, &env);
        let mut last = None;
        while let Ok(s) = rx.recv_timeout(limit) {
            if s.rank == 0 && !s.log && final_line(&s.text) {
                last = Some(s.text);
            }
        }
        for c in children {
            let (_, status) = finish(c, limit);
            assert!(status.is_some_and(|s| s.success()), "the clean run failed");
        }
        last.unwrap_or_else(|| panic!("the clean run has no final line"))
    };
    let mut report = format!("{}\nclean: {clean}\n", net.describe());
    // `LAZY_CUT=V:K` runs only rank V cut off, rank K killed; `LAZY_ROUNDS=N` runs every
    // pair N times.
    let only = std::env::var("LAZY_CUT").unwrap_or_default();
    let rounds: usize = std::env::var("LAZY_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    let (mut jobs, mut went_on) = (0, Vec::new());
    let pairs = (0..4).flat_map(|v| [(v, (v + 1) % 4), (v, (v + 2) % 4)]);
    let pairs: Vec<(usize, usize)> = pairs.collect();
    for _ in 0..rounds {
        for &(v, k) in &pairs {
            if !only.is_empty() && only != format!("{v}:{k}") {
                continue;
            }
            let (_store, env) = job();
            let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let (mut children, rx) = training(&net, 4, &args, &env);
            let mut seen: Vec<Said> = Vec::new();
            let next = |seen: &mut Vec<Said>, until: Instant| -> Option<usize> {
                let s = rx
                    .recv_timeout(until.saturating_duration_since(Instant::now()))
                    .ok()?;
                seen.push(s);
                Some(seen.len() - 1)
            };
            let started = Instant::now();
            while seen
                .iter()
                .filter(|s| !s.log && s.text.contains(": pid "))
                .count()
                < 4
            {
                next(&mut seen, started + limit).unwrap_or_else(|| panic!("the job did not start"));
            }
            std::thread::sleep(Duration::from_millis(150));
            let host = net.host_end(v);
            sh("ip", &["link", "set", &host, "down"]).unwrap_or_else(|e| panic!("{e}"));
            let cut = Instant::now();
            // The cut lasts until the survivors went on (or 8 s: five times the link
            // timeout, well within the agreement's 20 s).
            let lift = cut + Duration::from_secs(8);
            let survivors: Vec<usize> = (0..4).filter(|&r| r != v && r != k).collect();
            let (mut killed, mut on) = (false, 0);
            while let Some(i) = next(&mut seen, lift) {
                let s = &seen[i];
                if s.log || s.rank == v {
                    continue;
                }
                // Once another rank agrees, kill rank `k`.
                if !killed && s.text.contains("agreeing") {
                    let _ = children[k].kill();
                    killed = true;
                }
                if survivors.contains(&s.rank) && s.text.contains(": going on with ") {
                    on += 1;
                    if on == survivors.len() {
                        break;
                    }
                }
            }
            sh("ip", &["link", "set", &host, "up"]).unwrap_or_else(|e| panic!("{e}"));
            let healed = Instant::now();
            while next(&mut seen, cut + limit).is_some() {}
            for c in children.drain(..) {
                let _ = finish(c, Duration::from_secs(5));
            }
            let what = format!("rank {v} cut off, rank {k} killed");
            let said: String = seen
                .iter()
                .map(|s| {
                    let ms = s.at.saturating_duration_since(cut).as_secs_f64() * 1e3;
                    let from = if s.log { "log" } else { "out" };
                    format!("{ms:8.1} ms {from} [rank {}] {}\n", s.rank, s.text)
                })
                .collect();
            report += &format!("{what}:\n{said}");
            for &r in &survivors {
                let mine = |s: &&Said| s.rank == r && !s.log;
                // They went on while the cut lasted: the rank cut off was accounted for by
                // the others' evidence (their probes), not waited for until it came back.
                let on = seen
                    .iter()
                    .filter(mine)
                    .find(|s| s.text.contains(": going on with "));
                assert!(
                    on.is_some_and(|s| s.at < healed),
                    "{what}: rank {r} did not go on while rank {v} was cut off\n{said}"
                );
                if let Some(s) = on {
                    went_on.push(s.at.saturating_duration_since(cut));
                }
                let last = seen.iter().rfind(mine).map(|s| s.text.clone());
                let want = clean.replacen("rank 0: ", &format!("rank {r}: "), 1);
                assert_eq!(
                    last.as_deref(),
                    Some(want.as_str()),
                    "{what}: rank {r}\n{said}"
                );
                let first = seen
                    .iter()
                    .filter(mine)
                    .find(|s| s.text.contains(" failed ("));
                // Or the rank killed: a rank that had no link to `v` may hear of the kill
                // first.
                let names =
                    |s: &Said, x: usize| s.text.contains(&format!("peer rank {x} was lost"));
                assert!(
                    first.is_some_and(|s| names(s, v) || names(s, k)),
                    "{what}: rank {r}'s first error names neither rank {v} nor rank {k}\n{said}"
                );
            }
            assert!(
                seen.iter().any(|s| s.rank == v
                    && !s.log
                    && s.text
                        .contains("went on without this rank (its link to rank")),
                "{what}: rank {v} was not told it was left out\n{said}"
            );
            jobs += 1;
        }
    }
    went_on.sort();
    let at = |p: f64| went_on[((went_on.len() - 1) as f64 * p).round() as usize];
    if !went_on.is_empty() {
        report += &format!(
            "lazy connections, a rank cut off and another killed: {jobs} of {jobs} jobs with only the rank cut off left out; from the cut to a survivor going on p50 {} / p99 {} / max {} ms\n",
            at(0.5).as_millis(),
            at(0.99).as_millis(),
            at(1.0).as_millis()
        );
        println!("{}", report.lines().last().unwrap_or_default());
    }
    evidence("lazy-cut", &report);
}
