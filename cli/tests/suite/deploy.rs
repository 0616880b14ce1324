//! The container recipe (`deploy/`): the Kubernetes manifest's wiring is checked without a
//! cluster (`deploy/check_manifest.py`: an indexed Job whose pods can find pod 0, with the
//! variables of the launcher row collectix reads), and its ranks run as local processes with
//! exactly the variables the manifest gives them. `.ci/run` also builds the image where a
//! container engine runs.

use crate::common;
use common::example;
use std::path::Path;
use std::process::Command;

fn python_with_yaml() -> bool {
    Command::new("python3")
        .args(["-c", "import yaml"])
        .status()
        .is_ok_and(|s| s.success())
}

fn check_manifest(args: &[&std::ffi::OsStr]) -> (bool, String) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/check_manifest.py");
    let out = Command::new("python3")
        .arg(script)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

#[test]
fn the_kubernetes_manifest_is_wired_and_its_ranks_run_with_its_variables() {
    if !python_with_yaml() {
        assert!(
            std::env::var_os("CI").is_none(),
            "python3 with yaml is missing in CI: .ci/run installs python3-yaml"
        );
        eprintln!("SKIPPED: no python3 with yaml here (Debian: apt-get install python3-yaml)");
        return;
    }
    let exe = example("all_reduce");
    let (ok, text) = check_manifest(&["--run".as_ref(), exe.as_os_str()]);
    assert!(ok, "{text}");
    assert!(text.contains("an indexed Job of 4 ranks"), "{text}");
    common::assert_example_lines(&text, false, "");
}

#[test]
fn a_manifest_whose_pods_cannot_find_pod_0_is_refused() {
    if !python_with_yaml() {
        eprintln!("SKIPPED: no python3 with yaml here");
        return;
    }
    let good = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/k8s/check-job.yaml"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let dir = std::env::temp_dir().join(format!("collectix-deploy-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    for (from, to, says) in [
        (
            "completionMode: Indexed",
            "completionMode: NonIndexed",
            "Indexed",
        ),
        ("value: \"4\"", "value: \"3\"", "WORLD_SIZE"),
        (
            "collectix-check-0.collectix-check",
            "collectix-check-1.collectix-check",
            "pod 0",
        ),
        ("clusterIP: None", "clusterIP: 10.0.0.9", "headless"),
        ("secretKeyRef", "configMapKeyRef", "Secret"),
    ] {
        assert!(good.contains(from), "{from}");
        let bad = dir.join("bad.yaml");
        std::fs::write(&bad, good.replacen(from, to, 1)).unwrap_or_else(|e| panic!("{e}"));
        let (ok, text) = check_manifest(&[bad.as_os_str()]);
        assert!(!ok && text.contains(says), "{from} -> {to}: {text}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
