//! Every launcher of `docs/deployment.md`'s table: four processes of the README's example,
//! each started with the variables that launcher gives its processes, set by hand (as a pod,
//! `srun` or `mpiexec` would set them), join one job and print the example's lines. Where
//! the launcher itself is installed (`mpiexec.hydra`, MPICH's; Slurm's `srun`, with and
//! without PMIx), it starts them for real.
//! Elapsed-time bounds are hang guards, not timings.

use crate::common;
use common::{assert_example_lines, assert_runs_the_example, example, free_port};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Every variable a launcher row reads: cleared in each process, so that only the row's
/// own are set.
const ROW_VARS: &[&str] = &[
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "OMPI_MCA_ess_base_jobid",
    "PMI_RANK",
    "PMI_SIZE",
    "MPI_LOCALRANKID",
    "MPI_LOCALNRANKS",
    "PMIX_RANK",
    "PMIX_NAMESPACE",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_JOB_NODELIST",
    "SLURM_NODELIST",
    "SLURM_JOB_ID",
    "PET_NODE_RANK",
    "PET_NNODES",
    "PET_NPROC_PER_NODE",
    "PET_MASTER_ADDR",
    "PET_MASTER_PORT",
    "LWS_WORKER_INDEX",
    "LWS_GROUP_SIZE",
    "LWS_LEADER_ADDRESS",
    "JOB_COMPLETION_INDEX",
    "TORCHELASTIC_USE_AGENT_STORE",
];

/// A loopback port, free now, in the range a job id maps to (20000–39999), below the
/// kernel's ephemeral ports: the job id that gives it is `port - 20000`. Each test passes its
/// own `salt`, so that tests running at once do not pick the same port.
fn free_derived_port(salt: u16) -> u16 {
    let start = 20_000 + (std::process::id() % 1000) as u16 * 11 + salt * 3;
    (start..32_000)
        .step_by(37)
        .find(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
        .unwrap_or_else(|| panic!("no free port in 20000-31999"))
}

/// Starts four processes of the README's example, rank `r`'s with `vars(r)`; asserts each
/// exits 0 within a minute and that together they print every line of the example.
fn four_processes(vars: impl Fn(usize) -> Vec<(&'static str, String)>) {
    let exe = example("all_reduce");
    let children: Vec<Child> = (0..4)
        .map(|r| {
            let mut c = Command::new(&exe);
            for v in ROW_VARS {
                c.env_remove(v);
            }
            c.envs(vars(r))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| panic!("{e}"))
        })
        .collect();
    let start = Instant::now();
    let mut out = String::new();
    for (r, mut child) in children.into_iter().enumerate() {
        loop {
            if child.try_wait().ok().flatten().is_some() {
                break;
            }
            if start.elapsed() > Duration::from_secs(60) {
                let _ = child.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let o = child.wait_with_output().unwrap_or_else(|e| panic!("{e}"));
        let (so, se) = (
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr),
        );
        assert!(o.status.success(), "rank {r}: {:?}\n{so}\n{se}", o.status);
        out.push_str(&so);
    }
    assert_example_lines(&out, false, "");
}

fn s(v: impl ToString) -> String {
    v.to_string()
}

#[test]
fn torchrun_variables() {
    let port = free_port();
    four_processes(|r| {
        vec![
            ("RANK", s(r)),
            ("WORLD_SIZE", s(4)),
            ("LOCAL_RANK", s(r)),
            ("LOCAL_WORLD_SIZE", s(4)),
            ("MASTER_ADDR", s("127.0.0.1")),
            ("MASTER_PORT", s(port)),
        ]
    });
}

#[test]
fn open_mpi_variables_with_the_port_from_the_job_id() {
    let port = free_derived_port(1);
    four_processes(|r| {
        vec![
            ("OMPI_COMM_WORLD_RANK", s(r)),
            ("OMPI_COMM_WORLD_SIZE", s(4)),
            ("OMPI_COMM_WORLD_LOCAL_RANK", s(r)),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", s(4)),
            ("OMPI_MCA_ess_base_jobid", s(port - 20_000)),
        ]
    });
}

#[test]
fn hydra_variables_mpich_and_intel_mpi() {
    let port = free_port();
    four_processes(|r| {
        vec![
            ("PMI_RANK", s(r)),
            ("PMI_SIZE", s(4)),
            ("MPI_LOCALRANKID", s(r)),
            ("MPI_LOCALNRANKS", s(4)),
            ("MASTER_PORT", s(port)),
        ]
    });
}

#[test]
fn pmix_variables_under_srun() {
    let port = free_derived_port(2);
    four_processes(|r| {
        vec![
            ("PMIX_RANK", s(r)),
            ("PMIX_NAMESPACE", s("slurm.pmix.1.0")),
            ("SLURM_PROCID", s(r)),
            ("SLURM_NTASKS", s(4)),
            ("SLURM_LOCALID", s(r)),
            ("SLURM_NTASKS_PER_NODE", s(4)),
            ("SLURM_JOB_ID", s(port - 20_000)),
        ]
    });
}

#[test]
fn slurm_variables_with_the_host_from_the_node_list() {
    let port = free_derived_port(3);
    four_processes(|r| {
        vec![
            ("SLURM_PROCID", s(r)),
            ("SLURM_NTASKS", s(4)),
            ("SLURM_LOCALID", s(r)),
            ("SLURM_NTASKS_PER_NODE", s(4)),
            ("SLURM_JOB_NODELIST", s("localhost")),
            ("SLURM_JOB_ID", s(port - 20_000)),
        ]
    });
}

#[test]
fn kubeflow_trainer_variables_one_process_per_pod() {
    let port = free_port();
    four_processes(|r| {
        vec![
            ("PET_NODE_RANK", s(r)),
            ("PET_NNODES", s(4)),
            ("PET_NPROC_PER_NODE", s(1)),
            ("PET_MASTER_ADDR", s("127.0.0.1")),
            ("PET_MASTER_PORT", s(port)),
        ]
    });
}

#[test]
fn kubeflow_trainer_variables_read_by_collectix_launch() {
    // One pod of four processes: `collectix launch -- PROGRAM` with no argument but the
    // program takes its numbers from PET_*, as torchrun does.
    let mut c = Command::new(env!("CARGO_BIN_EXE_collectix"));
    for v in ROW_VARS {
        c.env_remove(v);
    }
    c.envs([
        ("PET_NNODES", s(1)),
        ("PET_NODE_RANK", s(0)),
        ("PET_NPROC_PER_NODE", s(4)),
        ("PET_MASTER_ADDR", s("127.0.0.1")),
        ("PET_MASTER_PORT", s(free_port())),
    ])
    .args(["launch", "--"])
    .arg(example("all_reduce"));
    assert_runs_the_example(&mut c, true);
}

#[test]
fn leader_worker_set_variables() {
    let port = free_port();
    four_processes(|r| {
        vec![
            ("LWS_WORKER_INDEX", s(r)),
            ("LWS_GROUP_SIZE", s(4)),
            ("LWS_LEADER_ADDRESS", s("127.0.0.1")),
            ("MASTER_PORT", s(port)),
        ]
    });
}

#[test]
fn indexed_job_and_jobset_variables() {
    let port = free_port();
    four_processes(|r| {
        vec![
            ("JOB_COMPLETION_INDEX", s(r)),
            ("WORLD_SIZE", s(4)),
            ("MASTER_ADDR", s("127.0.0.1")),
            ("MASTER_PORT", s(port)),
        ]
    });
}

#[test]
fn the_example_runs_under_mpich_mpiexec_hydra() {
    if Command::new("mpiexec.hydra")
        .arg("--version")
        .output()
        .is_err()
    {
        assert!(
            std::env::var_os("CI").is_none(),
            "mpiexec.hydra is missing in CI: .ci/run installs mpich"
        );
        eprintln!("SKIPPED: no mpiexec.hydra here (Debian: apt-get install mpich)");
        return;
    }
    assert_runs_the_example(
        Command::new("mpiexec.hydra")
            .args(["-n", "4", "-genv", "MASTER_PORT"])
            .arg(free_port().to_string())
            .arg(example("all_reduce")),
        false,
    );
}

/// Whether a Slurm controller answers here (`deploy/slurm/single-node.sh` starts one on
/// this machine; `.ci/run` does).
fn slurm_answers() -> bool {
    let answers = Command::new("sinfo")
        .arg("-h")
        .output()
        .is_ok_and(|o| o.status.success());
    if !answers {
        assert!(
            std::env::var_os("CI").is_none(),
            "no Slurm controller in CI: .ci/run starts one (deploy/slurm/single-node.sh)"
        );
        eprintln!(
            "SKIPPED: no Slurm controller here (Debian: apt-get install slurm-wlm libpmix-dev, then \
             deploy/slurm/single-node.sh as root)"
        );
    }
    answers
}

#[test]
fn the_example_runs_under_slurm_srun_and_with_pmix() {
    if !slurm_answers() {
        return;
    }
    // As docs/deployment.md writes it: `srun -n 4`, nothing else set (the port comes from
    // the job's id, the host from its node list). `--overcommit`: four tasks on a machine
    // that may have two CPUs. The Slurm row, then the PMIx one (`--mpi=pmix` adds
    // PMIX_RANK and PMIX_NAMESPACE), one after the other: each job's port is its own.
    for mpi in ["--mpi=none", "--mpi=pmix"] {
        let mut srun = Command::new("srun");
        for v in ROW_VARS {
            srun.env_remove(v);
        }
        srun.args(["-n", "4", "--overcommit", "--time=2", mpi])
            .arg(example("all_reduce"));
        assert_runs_the_example(&mut srun, false);
    }
}

#[test]
fn the_readme_example_runs_on_any_number_of_processes() {
    // It used to build the group [1, 3] whatever the size: "rank 3 is outside the parent
    // group of 2" at two processes.
    let exe = example("all_reduce");
    for (w, sum, min) in [
        (1, "[1, 2]", None),
        (2, "[3, 6]", Some("[2, 4]")),
        (3, "[6, 12]", Some("[2, 4]")),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_collectix"))
            .args([
                "launch",
                "--nproc-per-node",
                &w.to_string(),
                "--master-port",
            ])
            .arg(free_port().to_string())
            .arg("--")
            .arg(&exe)
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        let so = String::from_utf8_lossy(&out.stdout);
        let se = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "W={w}: {so}\n{se}");
        for r in 0..w {
            let want = format!("[rank {r}] rank {r}: sum {sum}");
            assert!(
                so.lines().any(|l| l == want),
                "W={w}: no {want:?} in:\n{so}\n{se}"
            );
        }
        if let Some(min) = min {
            let want = format!("[rank 1] rank 1: group_min {min}");
            assert!(
                so.lines().any(|l| l == want),
                "W={w}: no {want:?} in:\n{so}\n{se}"
            );
        }
    }
}

#[test]
fn an_examples_error_is_printed_as_its_text() {
    // Rust prints a `main`'s error in its Debug form: it was
    // `Error: InvalidArgument("rank 5 (from RANK) ...")`.
    let mut c = Command::new(example("all_reduce"));
    for v in ROW_VARS {
        c.env_remove(v);
    }
    let out = c
        .envs([("RANK", "5"), ("WORLD_SIZE", "2")])
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let se = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(
        se.trim(),
        "Error: invalid argument: rank 5 (from RANK) is not below the world size 2 (from WORLD_SIZE)"
    );
}

#[test]
fn logs_through_the_launcher_have_no_colour_codes() {
    let out = Command::new(env!("CARGO_BIN_EXE_collectix"))
        .env("RUST_LOG", "collectix=debug")
        .args(["launch", "--nproc-per-node", "2", "--master-port"])
        .arg(free_port().to_string())
        .arg("--")
        .arg(example("all_reduce"))
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let se = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{se}");
    assert!(se.contains("DEBUG"), "no debug log in:\n{se}");
    assert!(!se.contains('\u{1b}'), "colour codes in:\n{se}");
}
