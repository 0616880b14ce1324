//! Where this process stands in a multi-process job: its rank, the world's size, its place on
//! its host, and where the job's rendezvous store is, read the way `init_process_group` reads
//! them. [`JobConfig::resolve`] takes, in order:
//!
//! 1. explicit arguments ([`InitArgs`], or the builder [`Process::builder`](crate::Process::builder));
//! 2. the `init_method`: `env://` (the default), `tcp://host:port` or `file:///path`;
//! 3. the variables of the launcher that started this process. When several launchers'
//!    variables are set, the innermost launcher's count (torchrun started by `srun` or in a
//!    Kubernetes pod: torchrun's), in this order:
//!
//! | launcher | rank, size | on its host | store |
//! |---|---|---|---|
//! | torchrun, `collectix launch` | `RANK`, `WORLD_SIZE` | `LOCAL_RANK`, `LOCAL_WORLD_SIZE` | `MASTER_ADDR`, `MASTER_PORT` |
//! | Open MPI's `mpirun` | `OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE` | `OMPI_COMM_WORLD_LOCAL_RANK`, `OMPI_COMM_WORLD_LOCAL_SIZE` | one host: 127.0.0.1; else mpirun's host (`OMPI_MCA_orte_hnp_uri`); port from the job id |
//! | MPICH's and Intel MPI's `mpiexec` (Hydra) | `PMI_RANK`, `PMI_SIZE` | `MPI_LOCALRANKID`, `MPI_LOCALNRANKS` | one host: 127.0.0.1; `MASTER_PORT` needed |
//! | PMIx (`prterun`, `srun --mpi=pmix`) | `PMIX_RANK`, size from `WORLD_SIZE` or `SLURM_NTASKS` | `SLURM_LOCALID` | as Slurm; else `MASTER_ADDR`, port from `PMIX_NAMESPACE` |
//! | Slurm's `srun` | `SLURM_PROCID`, `SLURM_NTASKS` | `SLURM_LOCALID`, `SLURM_NTASKS_PER_NODE` | first host of `SLURM_JOB_NODELIST`; port from `SLURM_JOB_ID` |
//! | Kubeflow's trainer (one process per pod) | `PET_NODE_RANK`, `PET_NNODES` (with `PET_NPROC_PER_NODE` 1) | | `PET_MASTER_ADDR`, `PET_MASTER_PORT` |
//! | LeaderWorkerSet | `LWS_WORKER_INDEX`, `LWS_GROUP_SIZE` | | `LWS_LEADER_ADDRESS`; port 29500 |
//! | Kubernetes indexed Job, JobSet | `JOB_COMPLETION_INDEX`, `WORLD_SIZE` | | `MASTER_ADDR`; port 29500 |
//!
//! `MASTER_ADDR` and `MASTER_PORT`, where set, win over what a row derives. The rank
//! variables of torchrun and the MPI launchers must agree where several are set (a stale
//! `RANK` in a shell that runs `mpirun` is an error, not rank 0 four times); Slurm's and the
//! pods' count only when none of those is set, since an inner launcher's ranks differ from
//! them by design. A pod that runs several processes starts them with `collectix launch`,
//! which reads `PET_NNODES`, `PET_NODE_RANK`, `PET_NPROC_PER_NODE`, `PET_MASTER_ADDR` and
//! `PET_MASTER_PORT` as its defaults, as torchrun does.
//!
//! Slurm's compressed host list (`node[01-04,07]`) is expanded by [`parse_nodelist`]. A port
//! derived from a job's id falls in 20000–39999, the same on every rank.
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
    /// The address (or host name) this process is reached at by its peers (else
    /// `COLLECTIX_ADDR`, else the interface below).
    pub address: Option<String>,
    /// The network interface whose address this process is reached at, e.g. `eth0` (else
    /// `COLLECTIX_SOCKET_IFNAME`, else the local end of the route to the store's host).
    pub interface: Option<String>,
    /// How long a silent peer is given before it is lost (else `COLLECTIX_LINK_TIMEOUT`,
    /// else 10 s; see [`Liveness`](crate::transport::tcp::Liveness)).
    pub liveness: Option<crate::transport::tcp::Liveness>,
    /// Whether someone else (a launcher, `collectix store`) serves the TCP store, so that
    /// rank 0 connects to it instead of serving it (else `TORCHELASTIC_USE_AGENT_STORE`):
    /// see [`JobConfig::launcher_store`].
    pub launcher_store: Option<bool>,
    /// Which protocol the store speaks (else `COLLECTIX_STORE_PROTOCOL`, else as
    /// [`JobConfig::store_protocol`] says).
    pub store_protocol: Option<crate::store::StoreProtocol>,
    /// How many of the world's ranks are hot standbys (else `COLLECTIX_STANDBYS`, which
    /// `collectix launch --standby N` sets; else none): see [`JobConfig::standbys`].
    pub standbys: Option<usize>,
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

/// Who started the job, as far as the environment tells (the module doc's table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Launcher {
    /// Every setting came from the program's own arguments.
    Explicit,
    /// torchrun (or `collectix launch`, or anything that sets torchrun's variables).
    Torchrun,
    /// Open MPI's `mpirun`.
    OpenMpi,
    /// MPICH's or Intel MPI's `mpiexec` (the Hydra process manager: `PMI_RANK`).
    Hydra,
    /// A PMIx launcher (`prterun`, `srun --mpi=pmix`: `PMIX_RANK`).
    Pmix,
    /// Slurm's `srun`.
    Slurm,
    /// Kubeflow's trainer, one process per pod (`PET_NODE_RANK`).
    Kubeflow,
    /// A LeaderWorkerSet group (`LWS_WORKER_INDEX`).
    LeaderWorkerSet,
    /// A Kubernetes indexed Job or JobSet (`JOB_COMPLETION_INDEX`).
    IndexedJob,
}

/// Where one launcher keeps a process's place: the module doc's table, a row each.
struct Row {
    launcher: Launcher,
    rank: &'static str,
    /// The size's variables, the first set counts.
    size: &'static [&'static str],
    local_rank: &'static [&'static str],
    /// Processes on this host; a variable whose value is not a plain number is skipped
    /// (Slurm's `SLURM_NTASKS_PER_NODE` can be `2(x3)`).
    local_size: &'static [&'static str],
    /// Whether the rank must agree with the other rows of this kind (the launchers that start
    /// processes themselves).
    process: bool,
}

/// The rows, innermost launcher first.
const ROWS: [Row; 8] = [
    Row {
        launcher: Launcher::Torchrun,
        rank: "RANK",
        size: &["WORLD_SIZE"],
        local_rank: &["LOCAL_RANK"],
        local_size: &["LOCAL_WORLD_SIZE"],
        process: true,
    },
    Row {
        launcher: Launcher::OpenMpi,
        rank: "OMPI_COMM_WORLD_RANK",
        size: &["OMPI_COMM_WORLD_SIZE"],
        local_rank: &["OMPI_COMM_WORLD_LOCAL_RANK"],
        local_size: &["OMPI_COMM_WORLD_LOCAL_SIZE"],
        process: true,
    },
    Row {
        launcher: Launcher::Hydra,
        rank: "PMI_RANK",
        size: &["PMI_SIZE"],
        local_rank: &["MPI_LOCALRANKID"],
        local_size: &["MPI_LOCALNRANKS"],
        process: true,
    },
    Row {
        launcher: Launcher::Pmix,
        rank: "PMIX_RANK",
        size: &["WORLD_SIZE", "SLURM_NTASKS"],
        local_rank: &["SLURM_LOCALID"],
        local_size: &["SLURM_NTASKS_PER_NODE"],
        process: true,
    },
    Row {
        launcher: Launcher::Slurm,
        rank: "SLURM_PROCID",
        size: &["SLURM_NTASKS"],
        local_rank: &["SLURM_LOCALID"],
        local_size: &["SLURM_NTASKS_PER_NODE"],
        process: false,
    },
    Row {
        launcher: Launcher::Kubeflow,
        rank: "PET_NODE_RANK",
        size: &["PET_NNODES"],
        local_rank: &[],
        local_size: &[],
        process: false,
    },
    Row {
        launcher: Launcher::LeaderWorkerSet,
        rank: "LWS_WORKER_INDEX",
        size: &["LWS_GROUP_SIZE"],
        local_rank: &[],
        local_size: &[],
        process: false,
    },
    Row {
        launcher: Launcher::IndexedJob,
        rank: "JOB_COMPLETION_INDEX",
        size: &["WORLD_SIZE"],
        local_rank: &[],
        local_size: &[],
        process: false,
    },
];

/// The store's port where a launcher gives none and no job id names one (torchrun's default).
const DEFAULT_PORT: u16 = 29500;

impl Launcher {
    /// The launcher whose variables are in this process's environment (`None`: none is, so
    /// the program was started by hand). Examples use it to tell whether to join a job.
    pub fn detect() -> Option<Launcher> {
        Launcher::detect_in(&|k| std::env::var(k).ok())
    }

    /// [`detect`](Launcher::detect) over any source of variables.
    pub fn detect_in(env: &dyn Fn(&str) -> Option<String>) -> Option<Launcher> {
        ROWS.iter()
            .find(|r| var(env, r.rank).is_some())
            .map(|r| r.launcher)
    }
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
    /// Which protocol the job's TCP store speaks: `COLLECTIX_STORE_PROTOCOL` (`collectix` or
    /// `torch`) if set; else torch's where the environment says a launcher serves the store
    /// (`TORCHELASTIC_USE_AGENT_STORE=True`: torchrun's agent serves torch's `TCPStore`;
    /// `collectix launch` says `COLLECTIX_STORE_PROTOCOL=collectix` beside it); else
    /// collectix's own. A rank 0 that serves the store with `torch` serves torch's clients
    /// too. torch's protocol has no authentication: see `docs/deployment.md`, "The store".
    pub store_protocol: crate::store::StoreProtocol,
    /// Which of torchrun's attempts at the job this is, where its agent serves torch's store
    /// (`TORCHELASTIC_RESTART_COUNT` with `TORCHELASTIC_USE_AGENT_STORE=True`, torch's
    /// protocol); 0 otherwise. torchrun's `--max-restarts` starts every worker again, with
    /// the same store under its static rendezvous: the keys of attempt N > 0 live under
    /// `worker/attempt_N/`, so that no rank reads what the last attempt left there.
    pub attempt: u32,
    /// Which process of its rank this is: 0 for the first, one more for each restart
    /// (`COLLECTIX_INCARNATION`, which `collectix launch --max-restarts` sets). A process
    /// with a higher one rejoins a running job: see `Process::rejoin`.
    pub incarnation: u32,
    /// How many of the `world_size` ranks are hot standbys: the last ones, which join and
    /// connect but stay out of the world group, each waiting to take a lost rank's place
    /// (`Process::stand_by`). `COLLECTIX_STANDBYS`, which `collectix launch --standby N`
    /// sets; below `world_size`.
    pub standbys: usize,
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
        // The innermost launcher's row: the first whose rank variable is set.
        let row = ROWS.iter().find(|r| var(env, r.rank).is_some());
        // The launchers that start processes must agree, on the rank and on the size.
        let process_rows = || ROWS.iter().filter(|r| r.process);
        let ranks: Vec<(&str, usize)> = process_rows()
            .filter_map(|r| {
                number(env, r.rank)
                    .transpose()
                    .map(|v| v.map(|v| (r.rank, v)))
            })
            .collect::<Result<_>>()?;
        let sizes: Vec<(&str, usize)> = ["WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"]
            .iter()
            .filter_map(|n| number(env, n).transpose().map(|v| v.map(|v| (*n, v))))
            .collect::<Result<_>>()?;
        for set in [&ranks, &sizes] {
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
        let from_row = match row {
            Some(r) => {
                let rank = number(env, r.rank)?.unwrap_or(0);
                (r.launcher, Some((r.rank, rank)), first(env, r.size)?)
            }
            // No rank variable: the size alone may still come from torchrun's.
            None => (Launcher::Explicit, None, first(env, &["WORLD_SIZE"])?),
        };
        let (launcher, env_rank, env_size) = from_row;
        if launcher == Launcher::Kubeflow && args.rank.is_none() {
            if let Some(n) = var(env, "PET_NPROC_PER_NODE").filter(|n| n != "1") {
                return Err(Error::invalid(format!(
                    "PET_NPROC_PER_NODE={n}: this pod runs several processes; start them with `collectix launch` (it reads PET_NNODES, PET_NODE_RANK, PET_NPROC_PER_NODE, PET_MASTER_ADDR and PET_MASTER_PORT) or torchrun"
                )));
            }
        }
        let (rank_from, rank) = match (args.rank, env_rank) {
            (Some(r), _) => ("the rank argument", r),
            (None, Some(found)) => found,
            (None, None) => {
                return Err(Error::invalid(
                    "no rank: pass one, or set RANK (torchrun's variables: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), or start the job with a launcher (docs/deployment.md lists them)",
                ))
            }
        };
        let (size_from, world_size) = match (args.world_size, env_size) {
            (Some(w), _) => ("the world_size argument", w),
            (None, Some(found)) => found,
            (None, None) => {
                let want = row
                    .and_then(|r| r.size.first())
                    .copied()
                    .unwrap_or("WORLD_SIZE");
                return Err(Error::invalid(format!(
                    "no world size: pass one, or set {want} (torchrun's variables: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)"
                )));
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
        let local_rank = match row {
            Some(r) => first(env, r.local_rank)?.map_or(0, |(_, v)| v),
            None => 0,
        };
        let local_world_size = row.and_then(|r| {
            r.local_size
                .iter()
                .find_map(|n| var(env, n).and_then(|v| v.parse::<usize>().ok()))
        });
        let launcher = if args.rank.is_some() && args.world_size.is_some() {
            Launcher::Explicit
        } else {
            launcher
        };
        let rendezvous = rendezvous(args, env, launcher, world_size, local_world_size)?;
        let agent_store = var(env, "TORCHELASTIC_USE_AGENT_STORE")
            .is_some_and(|v| v.eq_ignore_ascii_case("true") || v == "1");
        let launcher_store = args.launcher_store.unwrap_or(agent_store);
        let store_protocol = match (args.store_protocol, var(env, "COLLECTIX_STORE_PROTOCOL")) {
            (Some(p), _) => p,
            (None, Some(v)) => crate::store::StoreProtocol::from_word(&v)?,
            (None, None) if agent_store && args.launcher_store.is_none() => {
                crate::store::StoreProtocol::Torch
            }
            (None, None) => crate::store::StoreProtocol::Collectix,
        };
        let attempt = match var(env, "TORCHELASTIC_RESTART_COUNT") {
            Some(v) if agent_store && store_protocol == crate::store::StoreProtocol::Torch => {
                v.trim().parse::<u32>().map_err(|_| {
                    Error::invalid(format!(
                        "TORCHELASTIC_RESTART_COUNT={v:?} is not a non-negative integer"
                    ))
                })?
            }
            _ => 0,
        };
        let incarnation = match var(env, "COLLECTIX_INCARNATION") {
            None => 0,
            Some(v) => v.parse::<u32>().map_err(|_| {
                Error::invalid(format!(
                    "COLLECTIX_INCARNATION={v:?} is not a non-negative integer"
                ))
            })?,
        };
        let standbys = match (args.standbys, var(env, "COLLECTIX_STANDBYS")) {
            (Some(n), _) => n,
            (None, None) => 0,
            (None, Some(v)) => v.trim().parse::<usize>().map_err(|_| {
                Error::invalid(format!(
                    "COLLECTIX_STANDBYS={v:?} is not a non-negative integer"
                ))
            })?,
        };
        if standbys >= world_size {
            return Err(Error::invalid(format!(
                "{standbys} standbys leave no rank of a world of {world_size} to stand by for"
            )));
        }
        Ok(JobConfig {
            rank,
            world_size,
            local_rank,
            local_world_size,
            rendezvous,
            launcher,
            launcher_store,
            store_protocol,
            attempt,
            incarnation,
            standbys,
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
    let one_host = local_world_size == Some(world_size);
    let needed = |what: &str| {
        Error::invalid(format!(
            "MASTER_ADDR is not set{what}: set MASTER_ADDR (rank 0's host) and MASTER_PORT, or pass init_method tcp://HOST:PORT"
        ))
    };
    let slurm_host = || -> Result<Option<String>> {
        let Some(list) = var(env, "SLURM_JOB_NODELIST").or_else(|| var(env, "SLURM_NODELIST"))
        else {
            return Ok(None);
        };
        parse_nodelist(&list)?
            .into_iter()
            .next()
            .map(Some)
            .ok_or_else(|| Error::invalid(format!("SLURM_JOB_NODELIST={list:?} names no host")))
    };
    let host = match var(env, "MASTER_ADDR") {
        Some(h) => h,
        None => match launcher {
            Launcher::OpenMpi | Launcher::Hydra | Launcher::Pmix if one_host => "127.0.0.1".into(),
            Launcher::OpenMpi => var(env, "OMPI_MCA_orte_hnp_uri")
                .and_then(|u| hnp_host(&u))
                .ok_or_else(|| needed(", and mpirun's host is not in OMPI_MCA_orte_hnp_uri"))?,
            Launcher::Slurm | Launcher::Pmix => {
                slurm_host()?.ok_or_else(|| needed(" (nor SLURM_JOB_NODELIST)"))?
            }
            Launcher::Hydra => return Err(needed(
                " and the job spans hosts (mpiexec -genv MASTER_ADDR HOST -genv MASTER_PORT PORT)",
            )),
            Launcher::Kubeflow => {
                var(env, "PET_MASTER_ADDR").ok_or_else(|| needed(" (nor PET_MASTER_ADDR)"))?
            }
            Launcher::LeaderWorkerSet => {
                var(env, "LWS_LEADER_ADDRESS").ok_or_else(|| needed(" (nor LWS_LEADER_ADDRESS)"))?
            }
            Launcher::Torchrun | Launcher::Explicit | Launcher::IndexedJob => {
                return Err(needed(""))
            }
        },
    };
    let port_var = |name: &str| -> Result<Option<u16>> {
        var(env, name)
            .map(|p| {
                p.parse::<u16>()
                    .ok()
                    .filter(|&p| p != 0)
                    .ok_or_else(|| Error::invalid(format!("{name}={p:?} is not a port (1-65535)")))
            })
            .transpose()
    };
    let from_id = |id: Option<u64>| id.map(|id| (PORT_BASE + id % PORT_SPAN) as u16);
    let numeric = |name: &str| var(env, name).and_then(|j| j.parse::<u64>().ok());
    let port = match port_var("MASTER_PORT")? {
        Some(p) => p,
        None => {
            let derived = match launcher {
                Launcher::OpenMpi => from_id(numeric("OMPI_MCA_ess_base_jobid")),
                Launcher::Slurm => from_id(numeric("SLURM_JOB_ID")),
                Launcher::Pmix => from_id(
                    numeric("SLURM_JOB_ID")
                        .or_else(|| var(env, "PMIX_NAMESPACE").map(|n| fnv1a(&n))),
                ),
                Launcher::Kubeflow => Some(port_var("PET_MASTER_PORT")?.unwrap_or(DEFAULT_PORT)),
                Launcher::LeaderWorkerSet | Launcher::IndexedJob => Some(DEFAULT_PORT),
                Launcher::Hydra | Launcher::Torchrun | Launcher::Explicit => None,
            };
            derived.ok_or_else(|| {
                Error::invalid(
                    "MASTER_PORT is not set (and no job id to derive a port from): set MASTER_PORT",
                )
            })?
        }
    };
    Ok(Rendezvous::Tcp { host, port })
}

/// FNV-1a of a text: a port derived from a name is the same in every process and build.
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
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
