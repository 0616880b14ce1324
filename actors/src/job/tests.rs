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
            incarnation: 0,
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
