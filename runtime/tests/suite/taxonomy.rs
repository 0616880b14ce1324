//! The error taxonomy stays honest: a bug in collectix is `Error::Internal`, never an
//! `InvalidArgument` that blames the caller. Scans the sources of the runtime and
//! the actors for argument errors whose text says "internal".

use std::path::{Path, PathBuf};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn no_internal_text_inside_an_argument_error() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    sources(&root.join("src"), &mut files);
    sources(&root.join("../actors/src"), &mut files);
    assert!(files.len() > 20, "found only {} source files", files.len());
    let mut bad = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            if l.contains("Error::invalid(") || l.contains("InvalidArgument(") {
                let window = lines[i..lines.len().min(i + 3)].join(" ");
                if window.to_lowercase().contains("\"internal") {
                    bad.push(format!("{}:{}", f.display(), i + 1));
                }
            }
        }
    }
    assert!(bad.is_empty(), "argument errors that say internal: {bad:?}");
}

#[test]
fn an_internal_error_says_it_is_a_bug_and_travels_as_itself() {
    use collectix_runtime::wire::AbortReason;
    use collectix_runtime::{Error, GroupId};
    let e = Error::internal("a reduce step without an op");
    assert!(e.to_string().contains("a bug, please report it"), "{e}");
    let back = AbortReason::from(&e).into_error(GroupId::WORLD, 0);
    assert_eq!(back, e);
}
