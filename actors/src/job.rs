//! Where this process stands in a multi-process job: its rank, the world's size, its place on
//! its host, and where the job's rendezvous store is, read the way `init_process_group` reads
//! them. [`JobConfig::resolve`] takes, in order:
//!
//! 1. explicit arguments ([`InitArgs`]);
//! 2. the `init_method`: `env://` (the default), `tcp://host:port` or `file:///path`;
//! 3. torchrun's variables (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`,
//!    `MASTER_ADDR`, `MASTER_PORT`), which Kubernetes training operators set too;
//! 4. Open MPI's (`OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE`, `OMPI_COMM_WORLD_LOCAL_RANK`,
//!    `OMPI_COMM_WORLD_LOCAL_SIZE`);
//! 5. Slurm's (`SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`, `SLURM_JOB_NODELIST`,
//!    `SLURM_JOB_ID`).
//!
//! Where the store is, when no `MASTER_ADDR` says so:
//! - Under Open MPI, on one host: `127.0.0.1`. On several hosts: the host `mpirun` runs on (from
//!   `OMPI_MCA_orte_hnp_uri`), where Open MPI's default mapping places rank 0.
//! - Under Slurm: the first host of `SLURM_JOB_NODELIST`, whose compressed form
//!   (`node[01-04,07]`) [`parse_nodelist`] expands.
//!
//! The port, when no `MASTER_PORT` says so, is derived from the job's id (Open MPI's jobid,
//! Slurm's `SLURM_JOB_ID`), so that every rank derives the same one.
//!
//! A setting that is missing, unparsable or contradicts another is an
//! [`Error::InvalidArgument`] that names the variable to set.

use collectix_runtime::{Error, Result};
use std::path::PathBuf;

/// What the program passes itself (each overrides the environment), like
/// `init_process_group(init_method, rank, world_size)`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InitArgs {
    /// `env://` (the default), `tcp://host:port` or `file:///path`.
    pub init_method: Option<String>,
    /// This process's rank.
    pub rank: Option<usize>,
    /// The number of processes.
    pub world_size: Option<usize>,
    /// When to connect to the peers (else `COLLECTIX_CONNECT`, else eager).
    pub connect: Option<crate::transport::mesh::Connect>,
    /// Whether the ranks of one host use shared memory (else `COLLECTIX_TRANSPORT`, else
    /// [`Transport::Auto`](crate::Transport::Auto)).
    pub transport: Option<crate::transport::Transport>,
    /// This process's host identity: ranks with the same one share memory (else
    /// `COLLECTIX_HOST_ID`, else the kernel's boot id and the network namespace; see
    /// `docs/architecture.md`, "Shared memory").
    pub host_id: Option<String>,
    /// The job's secret and where it may listen (else [`Security::from_env`](crate::Security::from_env)).
    pub security: Option<crate::security::Security>,
    /// How long a silent peer is given before it is lost (else `COLLECTIX_LINK_TIMEOUT`,
    /// else 10 s; see [`Liveness`](crate::transport::tcp::Liveness)).
    pub liveness: Option<crate::transport::tcp::Liveness>,
    /// Whether someone else (a launcher, `collectix store`) serves the TCP store, so that
    /// rank 0 connects to it instead of serving it (else `TORCHELASTIC_USE_AGENT_STORE`):
    /// see [`JobConfig::launcher_store`].
    pub launcher_store: Option<bool>,
}

/// Where the job's rendezvous store is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rendezvous {
    /// A TCP store: rank 0 serves it on `port` (unless the launcher does:
    /// [`JobConfig::launcher_store`]); every rank connects to `host:port`.
    Tcp {
        /// Rank 0's host (a name, an IPv4 or an IPv6 address).
        host: String,
        /// The port.
        port: u16,
    },
    /// A file on a file system every rank sees.
    File {
        /// Its path.
        path: PathBuf,
    },
}

/// Who started the job, as far as the environment tells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launcher {
    /// Every setting came from the program's own arguments.
    Explicit,
    /// torchrun (or `collectix launch`, or anything that sets torchrun's variables).
    Torchrun,
    /// Open MPI's `mpirun`.
    OpenMpi,
    /// Slurm's `srun`.
    Slurm,
}

/// This process's place in the job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobConfig {
    /// This process's rank, `< world_size`.
    pub rank: usize,
    /// The number of processes.
    pub world_size: usize,
    /// This process's rank among those on its host.
    pub local_rank: usize,
    /// Processes on this host, where the launcher says.
    pub local_world_size: Option<usize>,
    /// Where the store is.
    pub rendezvous: Rendezvous,
    /// Where the rank and size came from.
    pub launcher: Launcher,
    /// The launcher serves the TCP store (torchrun's `TORCHELASTIC_USE_AGENT_STORE=True`,
    /// which `collectix launch` sets too): rank 0 connects to it like every other rank
    /// instead of serving it, so the store outlives any rank.
    pub launcher_store: bool,
    /// Which process of its rank this is: 0 for the first, one more for each restart
    /// (`COLLECTIX_INCARNATION`, which `collectix launch --max-restarts` sets). A process
    /// with a higher one rejoins a running job: see `Process::rejoin`.
    pub incarnation: u32,
}

/// Ports derived from a job id fall in `PORT_BASE..PORT_BASE + PORT_SPAN`.
const PORT_BASE: u64 = 20_000;
const PORT_SPAN: u64 = 20_000;

fn var(env: &dyn Fn(&str) -> Option<String>, name: &str) -> Option<String> {
    env(name)
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

fn number(env: &dyn Fn(&str) -> Option<String>, name: &str) -> Result<Option<usize>> {
    var(env, name)
        .map(|v| {
            v.parse::<usize>()
                .map_err(|_| Error::invalid(format!("{name}={v:?} is not a non-negative integer")))
        })
        .transpose()
}

/// The first of the variables that is set, with its name.
fn first(
    env: &dyn Fn(&str) -> Option<String>,
    names: &[&'static str],
) -> Result<Option<(&'static str, usize)>> {
    for &n in names {
        if let Some(v) = number(env, n)? {
            return Ok(Some((n, v)));
        }
    }
    Ok(None)
}

impl JobConfig {
    /// [`resolve`](JobConfig::resolve) with this process's environment.
    pub fn from_env(args: &InitArgs) -> Result<JobConfig> {
        JobConfig::resolve(args, &|k| std::env::var(k).ok())
    }

    /// Resolves `args` against the environment `env` (a lookup, so that tests can pass
    /// theirs). See the module doc for the order.
    pub fn resolve(args: &InitArgs, env: &dyn Fn(&str) -> Option<String>) -> Result<JobConfig> {
        // Rank and size: each from the first source that has it; two launchers' variables
        // that disagree are an error naming both.
        let launcher = if var(env, "RANK").is_some() || var(env, "WORLD_SIZE").is_some() {
            Launcher::Torchrun
        } else if var(env, "OMPI_COMM_WORLD_RANK").is_some() {
            Launcher::OpenMpi
        } else if var(env, "SLURM_PROCID").is_some() {
            Launcher::Slurm
        } else {
            Launcher::Explicit
        };
        let rank_vars = ["RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"];
        let size_vars = ["WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"];
        let local_vars = ["LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"];
        let local_size_vars = [
            "LOCAL_WORLD_SIZE",
            "OMPI_COMM_WORLD_LOCAL_SIZE",
            "SLURM_NTASKS_PER_NODE",
        ];
        for vars in [rank_vars, size_vars] {
            let set: Vec<(&str, usize)> = vars
                .iter()
                .filter_map(|n| number(env, n).transpose().map(|v| v.map(|v| (*n, v))))
                .collect::<Result<_>>()?;
            if let Some(((a, x), (b, y))) = set
                .iter()
                .zip(set.iter().skip(1))
                .find(|((_, x), (_, y))| x != y)
            {
                return Err(Error::invalid(format!(
                    "{a}={x} and {b}={y} disagree: two launchers' settings are in the environment; unset one"
                )));
            }
        }
        let (rank_from, rank) = match (args.rank, first(env, &rank_vars)?) {
            (Some(r), _) => ("the rank argument", r),
            (None, Some((n, r))) => (n, r),
            (None, None) => {
                return Err(Error::invalid(
                    "no rank: pass one, or set RANK (torchrun's variables: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), or start the job with mpirun or srun",
                ))
            }
        };
        let (size_from, world_size) = match (args.world_size, first(env, &size_vars)?) {
            (Some(w), _) => ("the world_size argument", w),
            (None, Some((n, w))) => (n, w),
            (None, None) => {
                return Err(Error::invalid(
                    "no world size: pass one, or set WORLD_SIZE (torchrun's variables: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)",
                ))
            }
        };
        if world_size == 0 {
            return Err(Error::invalid(format!(
                "{size_from} is 0: a job needs a rank"
            )));
        }
        if rank >= world_size {
            return Err(Error::invalid(format!(
                "rank {rank} (from {rank_from}) is not below the world size {world_size} (from {size_from})"
            )));
        }
        let local_rank = first(env, &local_vars)?.map_or(0, |(_, v)| v);
        // Slurm's SLURM_NTASKS_PER_NODE can be "2(x3)": only a plain number counts.
        let local_world_size = local_size_vars
            .iter()
            .find_map(|n| var(env, n).and_then(|v| v.parse::<usize>().ok()));
        let launcher = if args.rank.is_some() && args.world_size.is_some() {
            Launcher::Explicit
        } else {
            launcher
        };
        let rendezvous = rendezvous(args, env, launcher, world_size, local_world_size)?;
        let launcher_store = args.launcher_store.unwrap_or_else(|| {
            var(env, "TORCHELASTIC_USE_AGENT_STORE")
                .is_some_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
        });
        let incarnation = match var(env, "COLLECTIX_INCARNATION") {
            None => 0,
            Some(v) => v.parse::<u32>().map_err(|_| {
                Error::invalid(format!(
                    "COLLECTIX_INCARNATION={v:?} is not a non-negative integer"
                ))
            })?,
        };
        Ok(JobConfig {
            rank,
            world_size,
            local_rank,
            local_world_size,
            rendezvous,
            launcher,
            launcher_store,
            incarnation,
        })
    }
}

/// The store's address, from the init method or the environment.
fn rendezvous(
    args: &InitArgs,
    env: &dyn Fn(&str) -> Option<String>,
    launcher: Launcher,
    world_size: usize,
    local_world_size: Option<usize>,
) -> Result<Rendezvous> {
    let method = args.init_method.as_deref().unwrap_or("env://");
    if let Some(path) = method.strip_prefix("file://") {
        if path.is_empty() {
            return Err(Error::invalid("init_method file:// names no path"));
        }
        return Ok(Rendezvous::File { path: path.into() });
    }
    if let Some(hp) = method.strip_prefix("tcp://") {
        let (host, port) = split_host_port(hp).ok_or_else(|| {
            Error::invalid(format!("init_method {method:?}: expected tcp://HOST:PORT"))
        })?;
        return Ok(Rendezvous::Tcp { host, port });
    }
    if method != "env://" {
        return Err(Error::invalid(format!(
            "init_method {method:?}: expected env://, tcp://HOST:PORT or file:///PATH"
        )));
    }
    let host = match var(env, "MASTER_ADDR") {
        Some(h) => h,
        None => match launcher {
            Launcher::OpenMpi if local_world_size == Some(world_size) => "127.0.0.1".into(),
            Launcher::OpenMpi => var(env, "OMPI_MCA_orte_hnp_uri")
                .and_then(|u| hnp_host(&u))
                .ok_or_else(|| {
                    Error::invalid(
                        "MASTER_ADDR is not set, and mpirun's host is not in OMPI_MCA_orte_hnp_uri: set MASTER_ADDR to rank 0's host",
                    )
                })?,
            Launcher::Slurm => {
                let list = var(env, "SLURM_JOB_NODELIST")
                    .or_else(|| var(env, "SLURM_NODELIST"))
                    .ok_or_else(|| {
                        Error::invalid(
                            "neither MASTER_ADDR nor SLURM_JOB_NODELIST is set: set MASTER_ADDR to rank 0's host",
                        )
                    })?;
                parse_nodelist(&list)?
                    .into_iter()
                    .next()
                    .ok_or_else(|| Error::invalid(format!("SLURM_JOB_NODELIST={list:?} names no host")))?
            }
            Launcher::Torchrun | Launcher::Explicit => {
                return Err(Error::invalid(
                    "MASTER_ADDR is not set: set MASTER_ADDR (rank 0's host) and MASTER_PORT, or pass init_method tcp://HOST:PORT",
                ))
            }
        },
    };
    let port =
        match var(env, "MASTER_PORT") {
            Some(p) => p.parse::<u16>().ok().filter(|&p| p != 0).ok_or_else(|| {
                Error::invalid(format!("MASTER_PORT={p:?} is not a port (1-65535)"))
            })?,
            None => {
                let job = match launcher {
                    Launcher::OpenMpi => var(env, "OMPI_MCA_ess_base_jobid"),
                    Launcher::Slurm => var(env, "SLURM_JOB_ID"),
                    _ => None,
                };
                let id = job.and_then(|j| j.parse::<u64>().ok()).ok_or_else(|| {
                    Error::invalid(
                    "MASTER_PORT is not set (and no job id to derive a port from): set MASTER_PORT",
                )
                })?;
                (PORT_BASE + id % PORT_SPAN) as u16
            }
        };
    Ok(Rendezvous::Tcp { host, port })
}

/// "host:port", "[v6]:port".
fn split_host_port(s: &str) -> Option<(String, u16)> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (h, p) = rest.split_once("]:")?;
        (h, p)
    } else {
        s.rsplit_once(':')?
    };
    let port = port.parse::<u16>().ok().filter(|&p| p != 0)?;
    (!host.is_empty()).then(|| (host.to_string(), port))
}

/// The host of mpirun's URI (`"JOBID.0;tcp://192.0.2.2:51677;tcp6://[fd00::2]:45577"`): the
/// first `tcp://` address's host.
fn hnp_host(uri: &str) -> Option<String> {
    uri.split(';')
        .find_map(|p| p.strip_prefix("tcp://"))
        .and_then(|hp| hp.split(',').next())
        .and_then(split_host_port)
        .map(|(h, _)| h)
}

/// Expands Slurm's compressed host list: `node[01-04,07],gpu-a[1-2]` is node01, node02,
/// node03, node04, node07, gpu-a1, gpu-a2 (zero padding kept). Several bracket groups in one
/// name (`r[1-2]n[1-2]`) expand as a product, in order.
pub fn parse_nodelist(s: &str) -> Result<Vec<String>> {
    let bad = |why: &str| Error::invalid(format!("SLURM_JOB_NODELIST={s:?}: {why}"));
    // Split at commas outside brackets.
    let mut names = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                names.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        if !(0..=1).contains(&depth) {
            return Err(bad("unbalanced or nested brackets"));
        }
    }
    if depth != 0 {
        return Err(bad("unbalanced brackets"));
    }
    names.push(&s[start..]);
    let mut out = Vec::new();
    for name in names.into_iter().map(str::trim).filter(|n| !n.is_empty()) {
        let mut partial = vec![String::new()];
        let mut rest = name;
        while !rest.is_empty() {
            let Some(open) = rest.find('[') else {
                partial.iter_mut().for_each(|p| p.push_str(rest));
                break;
            };
            let prefix = &rest[..open];
            let close = rest[open..]
                .find(']')
                .ok_or_else(|| bad("unbalanced brackets"))?
                + open;
            let ranges = &rest[open + 1..close];
            let mut items = Vec::new();
            for r in ranges.split(',') {
                let (a, b) = r.split_once('-').unwrap_or((r, r));
                let (lo, hi) = (
                    a.parse::<u64>()
                        .map_err(|_| bad(&format!("{a:?} is not a number")))?,
                    b.parse::<u64>()
                        .map_err(|_| bad(&format!("{b:?} is not a number")))?,
                );
                if hi < lo || hi - lo > 100_000 {
                    return Err(bad(&format!("range {r:?}")));
                }
                let width = a.len();
                items.extend((lo..=hi).map(|v| format!("{v:0width$}")));
            }
            let mut next = Vec::with_capacity(partial.len() * items.len());
            for p in &partial {
                for it in &items {
                    next.push(format!("{p}{prefix}{it}"));
                }
            }
            partial = next;
            rest = &rest[close + 1..];
        }
        out.extend(partial);
    }
    if out.is_empty() {
        return Err(bad("no host"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
