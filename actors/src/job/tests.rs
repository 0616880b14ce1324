use super::*;
use crate::test_support::env;

fn resolve(args: &InitArgs, pairs: &[(&str, &str)]) -> Result<JobConfig> {
    JobConfig::resolve(args, &env(pairs))
}

fn err_names(r: Result<JobConfig>, var: &str) {
    match r {
        Err(Error::InvalidArgument(m)) => assert!(m.contains(var), "{m:?} does not name {var}"),
        other => panic!("{other:?}: not an error naming {var}"),
    }
}

#[test]
fn torchrun_variables() {
    let c = resolve(
        &InitArgs::default(),
        &[
            ("RANK", "3"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "node01"),
            ("MASTER_PORT", "29500"),
        ],
    );
    assert_eq!(
        c,
        Ok(JobConfig {
            rank: 3,
            world_size: 8,
            local_rank: 1,
            local_world_size: Some(2),
            rendezvous: Rendezvous::Tcp {
                host: "node01".into(),
                port: 29500
            },
            launcher: Launcher::Torchrun,
            launcher_store: false,
            store_protocol: crate::store::StoreProtocol::Collectix,
            attempt: 0,
            incarnation: 0,
            standbys: 0,
        })
    );
    err_names(
        resolve(&InitArgs::default(), &[("RANK", "0"), ("WORLD_SIZE", "2")]),
        "MASTER_ADDR",
    );
    err_names(
        resolve(
            &InitArgs::default(),
            &[("RANK", "0"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "1")],
        ),
        "WORLD_SIZE",
    );
    err_names(
        resolve(
            &InitArgs::default(),
            &[
                ("RANK", "2"),
                ("WORLD_SIZE", "2"),
                ("MASTER_ADDR", "h"),
                ("MASTER_PORT", "1"),
            ],
        ),
        "WORLD_SIZE",
    );
    err_names(
        resolve(
            &InitArgs::default(),
            &[
                ("RANK", "x"),
                ("WORLD_SIZE", "2"),
                ("MASTER_ADDR", "h"),
                ("MASTER_PORT", "1"),
            ],
        ),
        "RANK",
    );
    err_names(
        resolve(
            &InitArgs::default(),
            &[
                ("RANK", "0"),
                ("WORLD_SIZE", "2"),
                ("MASTER_ADDR", "h"),
                ("MASTER_PORT", "70000"),
            ],
        ),
        "MASTER_PORT",
    );
}

#[test]
fn explicit_arguments_win_and_init_methods_parse() {
    let args = InitArgs {
        init_method: Some("tcp://[fd00::2]:29400".into()),
        rank: Some(1),
        world_size: Some(4),
        ..InitArgs::default()
    };
    let c = resolve(&args, &[("RANK", "3"), ("WORLD_SIZE", "8")]);
    assert!(
        matches!(&c, Ok(JobConfig { rank: 1, world_size: 4, launcher: Launcher::Explicit, rendezvous: Rendezvous::Tcp { host, port: 29400 }, .. }) if host == "fd00::2"),
        "{c:?}"
    );
    let f = InitArgs {
        init_method: Some("file:///shared/job7/store".into()),
        rank: Some(0),
        world_size: Some(2),
        ..InitArgs::default()
    };
    assert!(matches!(
        resolve(&f, &[]),
        Ok(JobConfig {
            rendezvous: Rendezvous::File { .. },
            ..
        })
    ));
    for bad in ["tcp://host", "tcp://:29500", "udp://h:1", "file://"] {
        let a = InitArgs {
            init_method: Some(bad.into()),
            rank: Some(0),
            world_size: Some(1),
            ..InitArgs::default()
        };
        assert!(
            matches!(resolve(&a, &[]), Err(Error::InvalidArgument(_))),
            "{bad}"
        );
    }
    err_names(resolve(&InitArgs::default(), &[]), "RANK");
}

#[test]
fn open_mpi_variables() {
    let one_host = [
        ("OMPI_COMM_WORLD_RANK", "1"),
        ("OMPI_COMM_WORLD_SIZE", "4"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
        ("OMPI_MCA_ess_base_jobid", "736559105"),
        (
            "OMPI_MCA_orte_hnp_uri",
            "736559104.0;tcp://192.0.2.2:51677;tcp6://[fd00::2]:45577",
        ),
    ];
    let c = resolve(&InitArgs::default(), &one_host);
    assert!(
        matches!(&c, Ok(JobConfig { rank: 1, world_size: 4, local_rank: 1, launcher: Launcher::OpenMpi, rendezvous: Rendezvous::Tcp { host, port }, .. })
            if host == "127.0.0.1" && *port == (20_000 + 736_559_105 % 20_000) as u16),
        "{c:?}"
    );
    // Several hosts: mpirun's.
    let mut hosts = one_host.to_vec();
    hosts[3] = ("OMPI_COMM_WORLD_LOCAL_SIZE", "2");
    let c = resolve(&InitArgs::default(), &hosts);
    assert!(
        matches!(&c, Ok(JobConfig { rendezvous: Rendezvous::Tcp { host, .. }, .. }) if host == "192.0.2.2"),
        "{c:?}"
    );
    // MASTER_ADDR and MASTER_PORT win.
    hosts.push(("MASTER_ADDR", "node07"));
    hosts.push(("MASTER_PORT", "29501"));
    let c = resolve(&InitArgs::default(), &hosts);
    assert!(
        matches!(&c, Ok(JobConfig { rendezvous: Rendezvous::Tcp { host, port: 29501 }, .. }) if host == "node07"),
        "{c:?}"
    );
    // torchrun's and Open MPI's variables that disagree.
    let mut both = one_host.to_vec();
    both.push(("RANK", "0"));
    err_names(resolve(&InitArgs::default(), &both), "OMPI_COMM_WORLD_RANK");
}

#[test]
fn slurm_variables() {
    let vars = [
        ("SLURM_PROCID", "5"),
        ("SLURM_NTASKS", "8"),
        ("SLURM_LOCALID", "1"),
        ("SLURM_JOB_NODELIST", "gpu[07-08,11],login1"),
        ("SLURM_JOB_ID", "123456"),
    ];
    let c = resolve(&InitArgs::default(), &vars);
    assert!(
        matches!(&c, Ok(JobConfig { rank: 5, world_size: 8, local_rank: 1, launcher: Launcher::Slurm, rendezvous: Rendezvous::Tcp { host, port }, .. })
            if host == "gpu07" && *port == (20_000 + 123_456 % 20_000) as u16),
        "{c:?}"
    );
    err_names(
        resolve(
            &InitArgs::default(),
            &[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2")],
        ),
        "SLURM_JOB_NODELIST",
    );
}

#[test]
fn slurm_node_lists() {
    let p = |s: &str| parse_nodelist(s);
    assert_eq!(p("node01"), Ok(vec!["node01".into()]));
    assert_eq!(
        p("node[01-04,07]"),
        Ok(["node01", "node02", "node03", "node04", "node07"]
            .map(String::from)
            .to_vec())
    );
    assert_eq!(
        p("a[1-2],b,c[9-10]"),
        Ok(["a1", "a2", "b", "c9", "c10"].map(String::from).to_vec())
    );
    assert_eq!(
        p("r[1-2]n[08-09]"),
        Ok(["r1n08", "r1n09", "r2n08", "r2n09"]
            .map(String::from)
            .to_vec())
    );
    for bad in [
        "node[01-",
        "node[3-1]",
        "node[a-b]",
        "node]",
        "n[[1]]",
        "",
        "n[1-999999999]",
    ] {
        assert!(
            matches!(p(bad), Err(Error::InvalidArgument(_))),
            "{bad:?}: {:?}",
            p(bad)
        );
    }
}

/// `resolve`'s rank, size, launcher and store for `pairs`.
fn placed(pairs: &[(&str, &str)]) -> (usize, usize, usize, Launcher, String, u16) {
    match resolve(&InitArgs::default(), pairs) {
        Ok(JobConfig {
            rank,
            world_size,
            local_rank,
            launcher,
            rendezvous: Rendezvous::Tcp { host, port },
            ..
        }) => (rank, world_size, local_rank, launcher, host, port),
        other => panic!("{pairs:?}: {other:?}"),
    }
}

#[test]
fn torchrun_started_by_srun_takes_torchruns_rank() {
    // `srun torchrun --nproc-per-node 4 ...` on 2 nodes: SLURM_PROCID is the node's torchrun,
    // RANK the process's. This was an error ("SLURM_PROCID=1 and RANK=5 disagree").
    let c = placed(&[
        ("RANK", "5"),
        ("WORLD_SIZE", "8"),
        ("LOCAL_RANK", "1"),
        ("MASTER_ADDR", "gpu07"),
        ("MASTER_PORT", "29500"),
        ("SLURM_PROCID", "1"),
        ("SLURM_NTASKS", "2"),
        ("SLURM_LOCALID", "0"),
        ("SLURM_JOB_NODELIST", "gpu[07-08]"),
    ]);
    assert_eq!(c, (5, 8, 1, Launcher::Torchrun, "gpu07".into(), 29500));
    // Intel MPI's mpiexec inside an allocation: its ranks, not Slurm's.
    let c = placed(&[
        ("PMI_RANK", "3"),
        ("PMI_SIZE", "4"),
        ("MPI_LOCALRANKID", "3"),
        ("MPI_LOCALNRANKS", "4"),
        ("MASTER_PORT", "29600"),
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "1"),
    ]);
    assert_eq!(c, (3, 4, 3, Launcher::Hydra, "127.0.0.1".into(), 29600));
}

#[test]
fn hydra_variables() {
    // What `mpiexec.hydra -n 4` sets (MPICH 4.0, checked), with MASTER_PORT given.
    let one_host = [
        ("PMI_RANK", "2"),
        ("PMI_SIZE", "4"),
        ("PMI_FD", "6"),
        ("MPI_LOCALRANKID", "2"),
        ("MPI_LOCALNRANKS", "4"),
    ];
    let mut with_port = one_host.to_vec();
    with_port.push(("MASTER_PORT", "29600"));
    assert_eq!(
        placed(&with_port),
        (2, 4, 2, Launcher::Hydra, "127.0.0.1".into(), 29600)
    );
    // Hydra names no job: the port must be given.
    err_names(resolve(&InitArgs::default(), &one_host), "MASTER_PORT");
    // Across hosts the store's host must be given too.
    with_port[4] = ("MPI_LOCALNRANKS", "2");
    err_names(resolve(&InitArgs::default(), &with_port), "MASTER_ADDR");
    // A stale RANK that disagrees is an error.
    with_port.push(("RANK", "0"));
    err_names(resolve(&InitArgs::default(), &with_port), "PMI_RANK");
}

#[test]
fn pmix_variables() {
    // srun --mpi=pmix: Slurm's host list and job id; PMIx's rank.
    let c = placed(&[
        ("PMIX_RANK", "3"),
        ("PMIX_NAMESPACE", "slurm.pmix.77.0"),
        ("SLURM_PROCID", "3"),
        ("SLURM_NTASKS", "4"),
        ("SLURM_LOCALID", "1"),
        ("SLURM_JOB_NODELIST", "n[1-2]"),
        ("SLURM_JOB_ID", "77"),
    ]);
    assert_eq!(c, (3, 4, 1, Launcher::Pmix, "n1".into(), 20_077));
    // prterun with the size and host given: the port comes from the namespace, alike in
    // every process.
    let prte = [
        ("PMIX_RANK", "1"),
        ("PMIX_NAMESPACE", "prterun-node1-4242@1"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "node1"),
    ];
    let (rank, world, _, launcher, host, port) = placed(&prte);
    assert_eq!(
        (rank, world, launcher, host.as_str()),
        (1, 2, Launcher::Pmix, "node1")
    );
    assert!((20_000..40_000).contains(&port), "{port}");
    assert_eq!(placed(&prte).5, port);
    err_names(
        resolve(
            &InitArgs::default(),
            &[("PMIX_RANK", "1"), ("MASTER_ADDR", "h")],
        ),
        "WORLD_SIZE",
    );
}

#[test]
fn kubeflow_leader_worker_set_and_indexed_job_variables() {
    let kubeflow = [
        ("PET_NODE_RANK", "1"),
        ("PET_NNODES", "4"),
        ("PET_NPROC_PER_NODE", "1"),
        ("PET_MASTER_ADDR", "train-node-0-0.train"),
        ("PET_MASTER_PORT", "23456"),
    ];
    assert_eq!(
        placed(&kubeflow),
        (
            1,
            4,
            0,
            Launcher::Kubeflow,
            "train-node-0-0.train".into(),
            23456
        )
    );
    let mut several = kubeflow.to_vec();
    several[2] = ("PET_NPROC_PER_NODE", "4");
    err_names(resolve(&InitArgs::default(), &several), "collectix launch");
    assert_eq!(
        placed(&[
            ("LWS_WORKER_INDEX", "2"),
            ("LWS_GROUP_SIZE", "4"),
            ("LWS_LEADER_ADDRESS", "lws-0.lws.default"),
            ("LWS_NAME", "lws"),
        ]),
        (
            2,
            4,
            0,
            Launcher::LeaderWorkerSet,
            "lws-0.lws.default".into(),
            29500
        )
    );
    let indexed = [
        ("JOB_COMPLETION_INDEX", "3"),
        ("WORLD_SIZE", "4"),
        ("MASTER_ADDR", "check-0.check"),
    ];
    assert_eq!(
        placed(&indexed),
        (3, 4, 0, Launcher::IndexedJob, "check-0.check".into(), 29500)
    );
    err_names(resolve(&InitArgs::default(), &indexed[..2]), "MASTER_ADDR");
    err_names(
        resolve(&InitArgs::default(), &[indexed[0], indexed[2]]),
        "WORLD_SIZE",
    );
    // torchrun inside a pod: torchrun's rank, not the pod's index.
    let c = placed(&[
        ("RANK", "6"),
        ("WORLD_SIZE", "8"),
        ("MASTER_ADDR", "check-0.check"),
        ("MASTER_PORT", "29500"),
        ("JOB_COMPLETION_INDEX", "1"),
    ]);
    assert_eq!(c.0, 6);
}

#[test]
fn the_launcher_is_detected_from_its_rank_variable() {
    let d = |pairs: &[(&str, &str)]| Launcher::detect_in(&env(pairs));
    assert_eq!(d(&[]), None);
    assert_eq!(d(&[("WORLD_SIZE", "4")]), None);
    assert_eq!(d(&[("PMI_RANK", "0")]), Some(Launcher::Hydra));
    assert_eq!(
        d(&[("SLURM_PROCID", "0"), ("RANK", "3")]),
        Some(Launcher::Torchrun)
    );
    assert_eq!(
        d(&[("JOB_COMPLETION_INDEX", "0")]),
        Some(Launcher::IndexedJob)
    );
}

#[test]
fn the_store_protocol_is_torchs_under_an_agent_store_unless_said_otherwise() {
    use crate::store::StoreProtocol::{Collectix, Torch};
    let torchrun = [
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "h"),
        ("MASTER_PORT", "29500"),
    ];
    let with = |more: &[(&'static str, &'static str)], args: &InitArgs| {
        let mut pairs = torchrun.to_vec();
        pairs.extend_from_slice(more);
        resolve(args, &pairs).map(|c| (c.store_protocol, c.launcher_store))
    };
    let none = InitArgs::default();
    assert_eq!(with(&[], &none), Ok((Collectix, false)), "rank 0 serves");
    let agent = [("TORCHELASTIC_USE_AGENT_STORE", "True")];
    assert_eq!(
        with(&agent, &none),
        Ok((Torch, true)),
        "torchrun's agent store"
    );
    let launch = [
        ("TORCHELASTIC_USE_AGENT_STORE", "True"),
        ("COLLECTIX_STORE_PROTOCOL", "collectix"),
    ];
    assert_eq!(
        with(&launch, &none),
        Ok((Collectix, true)),
        "collectix launch"
    );
    let told = InitArgs {
        launcher_store: Some(true),
        ..InitArgs::default()
    };
    assert_eq!(
        with(&agent, &told),
        Ok((Collectix, true)),
        "a store said in code"
    );
    let torch = InitArgs {
        store_protocol: Some(Torch),
        ..InitArgs::default()
    };
    assert_eq!(
        with(&launch, &torch),
        Ok((Torch, true)),
        "the argument first"
    );
    let attempt = |more: &[(&'static str, &'static str)]| {
        let mut pairs = torchrun.to_vec();
        pairs.extend_from_slice(more);
        resolve(&none, &pairs).map(|c| c.attempt)
    };
    let again = ("TORCHELASTIC_RESTART_COUNT", "2");
    assert_eq!(
        attempt(&[agent[0], again]),
        Ok(2),
        "torchrun's third attempt"
    );
    assert_eq!(
        attempt(&[launch[0], launch[1], again]),
        Ok(0),
        "collectix launch's restarted rank rejoins the same keys"
    );
    let mut gloo = torchrun.to_vec();
    gloo.push(("COLLECTIX_STORE_PROTOCOL", "gloo"));
    err_names(resolve(&none, &gloo), "COLLECTIX_STORE_PROTOCOL");
}

#[test]
fn standbys_come_from_the_launcher_and_leave_a_rank_to_stand_by_for() {
    let with = |n: &str| {
        resolve(
            &InitArgs::default(),
            &[
                ("RANK", "8"),
                ("WORLD_SIZE", "9"),
                ("MASTER_ADDR", "127.0.0.1"),
                ("MASTER_PORT", "29500"),
                ("COLLECTIX_STANDBYS", n),
            ],
        )
    };
    assert!(matches!(
        with("1"),
        Ok(JobConfig {
            rank: 8,
            world_size: 9,
            standbys: 1,
            ..
        })
    ));
    assert!(with("9").is_err(), "a world of standbys only");
    assert!(with("x").is_err());
}
