//! `collectix bench --check` on small sizes for every collective, through the real binary:
//! every output element is compared with the bench's own arithmetic, and the run fails if
//! one is wrong.

use std::process::Command;

const COLLECTIVES: [&str; 10] = [
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather",
    "reduce_scatter",
    "gather",
    "scatter",
    "all_to_all",
    "send_recv",
    "barrier",
];

/// Small sizes (48 B to 48 KiB), two samples, the check on: quick.
const SMALL: [&str; 14] = [
    "-b",
    "48",
    "-e",
    "48K",
    "-f",
    "32",
    "-n",
    "2",
    "-w",
    "1",
    "--sample-ms",
    "0.2",
    "-c",
    "1",
];

fn bench(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_collectix"))
        .arg("bench")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run collectix: {e}"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

#[test]
fn every_collective_checks_out_on_small_sizes() {
    for ranks in ["3", "4"] {
        for c in COLLECTIVES {
            for dtype in ["float", "bfloat16", "int32"] {
                let mut args = vec!["--collective", c, "--ranks", ranks, "-d", dtype];
                args.extend(SMALL);
                let (ok, text) = bench(&args);
                assert!(ok, "{c} on {ranks} ranks, {dtype}:\n{text}");
                assert!(
                    text.contains("#wrong in total: 0"),
                    "{c} on {ranks} ranks:\n{text}"
                );
            }
        }
    }
}

#[test]
fn every_collective_checks_out_into_caller_buffers() {
    for c in COLLECTIVES.iter().filter(|c| **c != "send_recv") {
        let mut args = vec!["--collective", c, "--ranks", "3", "--buffers", "-o", "avg"];
        args.extend(SMALL);
        let (ok, text) = bench(&args);
        assert!(ok, "{c}:\n{text}");
        assert!(text.contains("outputs in caller buffers"), "{c}:\n{text}");
        assert!(text.contains("#wrong in total: 0"), "{c}:\n{text}");
    }
    let (ok, text) = bench(&[
        "--collective",
        "send_recv",
        "--buffers",
        "-b",
        "4",
        "-e",
        "4",
    ]);
    assert!(
        !ok && text.contains("--buffers runs the collectives"),
        "{text}"
    );
}

#[test]
fn ops_other_than_sum_check_out() {
    for op in ["prod", "min", "max", "avg"] {
        for c in ["all_reduce", "reduce", "reduce_scatter"] {
            let (ok, text) = bench(&[
                "--collective",
                c,
                "--ranks",
                "3",
                "-o",
                op,
                "-b",
                "96",
                "-e",
                "96",
                "-n",
                "2",
                "-w",
                "1",
                "--sample-ms",
                "0.2",
            ]);
            assert!(
                ok && text.contains("#wrong in total: 0"),
                "{c} {op}:\n{text}"
            );
        }
    }
}

#[test]
fn sizes_that_do_not_divide_are_skipped_with_a_note_and_json_is_written() {
    let dir = std::env::temp_dir().join(format!("collectix-bench-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let json = dir.join("rows.json");
    let (ok, text) = bench(&[
        "--collective",
        "all_gather",
        "--ranks",
        "3",
        "-b",
        "4",
        "-e",
        "12",
        "-f",
        "3",
        "-n",
        "2",
        "-w",
        "1",
        "--sample-ms",
        "0.2",
        "--json",
        json.to_str().unwrap_or_default(),
    ]);
    assert!(ok, "{text}");
    assert!(text.contains("4 B skipped"), "{text}");
    let rows = std::fs::read_to_string(&json).unwrap_or_default();
    assert!(
        rows.contains("\"collective\": \"all_gather\"")
            && rows.contains("\"busbw_gbs\"")
            && rows.contains("\"transport\": \"local\""),
        "{rows}"
    );
    // Each row carries its samples' times (the distribution its median is taken from).
    let parsed: serde_json::Value = serde_json::from_str(&rows).unwrap_or_default();
    let each = parsed.as_array().cloned().unwrap_or_default();
    assert!(!each.is_empty(), "{rows}");
    for row in &each {
        let samples = row["samples_us"].as_array().cloned().unwrap_or_default();
        let times: Vec<f64> = samples.iter().filter_map(|v| v.as_f64()).collect();
        assert_eq!(times.len(), 2, "two samples: {row}");
        assert!(times[0] <= times[1] && times[0] > 0.0, "{row}");
        assert_eq!(row["time_min_us"].as_f64(), Some(times[0]), "{row}");
    }
    // Piped, the progress line is not written (it was one long line of `\r`s in a file).
    assert!(!text.contains('\r'), "{text:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_run_in_which_every_size_is_skipped_fails_and_check_may_be_given_bare() {
    // reduce_scatter of 4 B on 3 ranks cannot divide: nothing is measured. It exited 0 with
    // an empty table.
    let (ok, text) = bench(&[
        "--collective",
        "reduce_scatter",
        "--ranks",
        "3",
        "-b",
        "4",
        "-e",
        "4",
        "-n",
        "2",
        "-w",
        "1",
        "--check",
    ]);
    assert!(!ok, "{text}");
    assert!(text.contains("every size was skipped"), "{text}");
}

/// `--transport tcp`: the bench starts its ranks as processes of their own; every collective
/// checks out over TCP, and only rank 0 prints the table.
#[test]
fn every_collective_checks_out_over_tcp_between_processes() {
    for c in COLLECTIVES {
        let mut args = vec!["--transport", "tcp", "--collective", c, "--ranks", "3"];
        args.extend(SMALL);
        let (ok, text) = bench(&args);
        assert!(ok, "{c} over tcp:\n{text}");
        assert!(text.contains("transport tcp"), "{c}:\n{text}");
        assert_eq!(
            text.matches("#wrong in total: 0").count(),
            1,
            "{c}:\n{text}"
        );
    }
}

/// `--bind auto` binds the in-process ranks' threads when there are cores enough for every
/// rank (and says so in the header), never when there are not; `--bind none` never does. The
/// results check out either way.
#[test]
fn ranks_are_bound_to_cores_only_when_the_cores_suffice() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    for (ranks, bind) in [(1, "auto"), (2, "auto"), (cores + 1, "auto"), (2, "none")] {
        let ranks = ranks.to_string();
        let mut args = vec![
            "--collective",
            "all_reduce",
            "--ranks",
            &ranks,
            "--bind",
            bind,
        ];
        args.extend(SMALL);
        let (ok, text) = bench(&args);
        assert!(ok, "{ranks} ranks, --bind {bind}:\n{text}");
        assert!(text.contains("#wrong in total: 0"), "{text}");
        let n: usize = ranks.parse().unwrap_or(0);
        let bound = bind == "auto" && n <= cores;
        assert_eq!(
            text.contains("(ranks bound to cores)"),
            bound,
            "{ranks} ranks on {cores} cores, --bind {bind}:\n{text}"
        );
        assert!(!text.contains("could not bind"), "{text}");
    }
}
