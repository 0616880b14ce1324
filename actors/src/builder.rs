//! [`ProcessBuilder`]: joining a job with its settings given in code, for a service that
//! embeds a communicator and learns its rank, the world's size and the store's address from
//! its own configuration rather than from a launcher's environment.
//!
//! What the builder is not told still comes from the environment, as [`init`](crate::init)
//! reads it (`docs/deployment.md`); [`ProcessBuilder::ignore_environment`] turns that off for
//! the job's identity (rank, world size, store, secret, interface, transport: no launcher's
//! variable is read), and leaves the tuning knobs it names.

use crate::job::{InitArgs, JobConfig};
use crate::process::{init_with, Process};
use crate::security::{Secret, Security};
use crate::transport::mesh::Connect;
use crate::transport::tcp::Liveness;
use crate::transport::Transport;
use collectix_runtime::{GroupOptions, Result};
use std::path::Path;
use std::time::Duration;

/// How long [`ProcessBuilder::init`] waits for the other ranks unless told.
pub const DEFAULT_JOIN_TIMEOUT: Duration = Duration::from_secs(300);

/// This process's place in a job, given in code: see the module doc.
///
/// ```no_run
/// use collectix_actors::{Process, Secret};
/// use std::time::Duration;
///
/// let process = Process::builder()
///     .rank(2)
///     .world_size(4)
///     .store("10.0.0.1:29500") // rank 0 serves it there
///     .secret(Secret::new("from the service's vault")?)
///     .interface("eth0") // where the peers reach this process
///     .timeout(Duration::from_secs(60))
///     .init()?;
/// let c = process.communicator();
/// # Ok::<(), collectix_runtime::Error>(())
/// ```
#[derive(Clone, Debug)]
#[must_use = "a builder does nothing until `init`"]
pub struct ProcessBuilder {
    args: InitArgs,
    options: GroupOptions,
    timeout: Duration,
    environment: bool,
}

impl Default for ProcessBuilder {
    fn default() -> Self {
        ProcessBuilder {
            args: InitArgs::default(),
            options: GroupOptions::default(),
            timeout: DEFAULT_JOIN_TIMEOUT,
            environment: true,
        }
    }
}

impl Process {
    /// A builder for this process's place in a job: rank, world size, store, secret,
    /// interface, given in code ([`ProcessBuilder`]).
    pub fn builder() -> ProcessBuilder {
        ProcessBuilder::default()
    }
}

impl ProcessBuilder {
    /// This process's rank, below [`world_size`](ProcessBuilder::world_size).
    pub fn rank(mut self, rank: usize) -> Self {
        self.args.rank = Some(rank);
        self
    }

    /// The number of processes in the job.
    pub fn world_size(mut self, world_size: usize) -> Self {
        self.args.world_size = Some(world_size);
        self
    }

    /// The TCP store, as `HOST:PORT` (`[v6]:PORT` for an IPv6 address; a `tcp://` prefix is
    /// accepted): rank 0 serves it there unless [`launcher_store`](Self::launcher_store) says
    /// someone else does.
    pub fn store(mut self, address: impl AsRef<str>) -> Self {
        let a = address.as_ref().trim();
        let a = a.strip_prefix("tcp://").unwrap_or(a);
        self.args.init_method = Some(format!("tcp://{a}"));
        self
    }

    /// A file store at `path`, on a file system every rank sees.
    pub fn store_file(mut self, path: impl AsRef<Path>) -> Self {
        self.args.init_method = Some(format!("file://{}", path.as_ref().display()));
        self
    }

    /// Whether the store is served by someone else (`collectix store`, a launcher), so that
    /// rank 0 connects to it like every other rank.
    pub fn launcher_store(mut self, yes: bool) -> Self {
        self.args.launcher_store = Some(yes);
        self
    }

    /// The job's secret: every connection proves it, and the ranks may listen on any
    /// address ([`Security::with_secret`]).
    pub fn secret(mut self, secret: Secret) -> Self {
        self.args.security = Some(Security::with_secret(secret));
        self
    }

    /// The whole security policy ([`Security`]), where [`secret`](Self::secret) is not
    /// enough (e.g. [`Security::insecure`] on a private network).
    pub fn security(mut self, security: Security) -> Self {
        self.args.security = Some(security);
        self
    }

    /// The network interface (e.g. `eth0`) whose address the peers reach this process at.
    pub fn interface(mut self, name: impl Into<String>) -> Self {
        self.args.interface = Some(name.into());
        self
    }

    /// The address (or host name) the peers reach this process at; wins over
    /// [`interface`](Self::interface).
    pub fn address(mut self, address: impl Into<String>) -> Self {
        self.args.address = Some(address.into());
        self
    }

    /// Whether the processes of one host use shared memory ([`Transport`]).
    pub fn transport(mut self, transport: Transport) -> Self {
        self.args.transport = Some(transport);
        self
    }

    /// This process's host identity: processes with the same one share memory.
    pub fn host_id(mut self, id: impl Into<String>) -> Self {
        self.args.host_id = Some(id.into());
        self
    }

    /// How long a silent peer is given before it is lost ([`Liveness`]).
    pub fn liveness(mut self, liveness: Liveness) -> Self {
        self.args.liveness = Some(liveness);
        self
    }

    /// When this process connects to its peers ([`Connect`]).
    pub fn connect(mut self, connect: Connect) -> Self {
        self.args.connect = Some(connect);
        self
    }

    /// The world group's options (its calls' timeout among them).
    pub fn group_options(mut self, options: GroupOptions) -> Self {
        self.options = options;
        self
    }

    /// How long [`init`](Self::init) waits for the store and the other ranks (default 5
    /// minutes; `Duration::MAX`: without end).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Reads no launcher's variable: what the builder was not told of the job has its
    /// default, and a rank, world size or store left out is an error. Without it, what is
    /// left out comes from the launcher's variables, as with [`init`](crate::init).
    ///
    /// The tuning knobs are still read, as documented in `docs/deployment.md`:
    /// `COLLECTIX_SPIN_US`, `COLLECTIX_HOST_ID` (unless [`host_id`](Self::host_id) is
    /// given), `COLLECTIX_SHM_RING` and `COLLECTIX_SHM_SINGLE_COPY` (when the shared-memory
    /// listener is bound), `COLLECTIX_BOARD` (when another rank of the host takes shared
    /// memory), `COLLECTIX_FLIGHT_RECORDER` (after a failed call), and with the `cuda`
    /// feature `COLLECTIX_NCCL_LIBRARY` with `VIRTUAL_ENV`, `CONDA_PREFIX`, `PATH` and `HOME`
    /// (where libnccl is looked for).
    pub fn ignore_environment(mut self) -> Self {
        self.environment = false;
        self
    }

    /// The settings as [`init`](crate::init) takes them.
    pub fn args(&self) -> &InitArgs {
        &self.args
    }

    /// Where this process would stand (rank, size, store), without joining: the settings
    /// given, then the environment's (unless ignored).
    pub fn config(&self) -> Result<JobConfig> {
        if self.environment {
            JobConfig::from_env(&self.args)
        } else {
            JobConfig::resolve(&self.args, &|_| None)
        }
    }

    /// Joins the job: meets the other ranks through the store and connects to them, within
    /// the [`timeout`](Self::timeout). See [`init`](crate::init).
    pub fn init(self) -> Result<Process> {
        init_with(&self.args, self.options, self.timeout, self.environment)
    }
}
