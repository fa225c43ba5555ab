//! Puts the git commit the binary was built from into `gpuwatch --version`.
//!
//! Order: `GPUWATCH_GIT_COMMIT` from the environment (container builds, whose
//! context has no `.git`), then `git` when this source tree is itself a git
//! checkout, else "unknown": a build from a source tarball must still work.

use std::path::{Path, PathBuf};
use std::process::Command;

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_string())
}

fn main() {
    println!("cargo::rerun-if-env-changed=GPUWATCH_GIT_COMMIT");
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let workspace = manifest.parent().unwrap_or(&manifest).to_path_buf();
    let commit = match std::env::var("GPUWATCH_GIT_COMMIT") {
        Ok(c) if !c.trim().is_empty() => c.trim().to_string(),
        _ => from_git(&workspace).unwrap_or_else(|| "unknown".to_string()),
    };
    println!("cargo::rustc-env=GPUWATCH_GIT_COMMIT={commit}");
}

/// The short commit of `workspace`, only if `workspace` is the top of a git
/// work tree: a tarball unpacked inside some other repository must not pick
/// up that repository's commit.
fn from_git(workspace: &Path) -> Option<String> {
    let top = git(workspace, &["rev-parse", "--show-toplevel"])?;
    let same = std::fs::canonicalize(&top).ok()? == std::fs::canonicalize(workspace).ok()?;
    if !same {
        return None;
    }
    // Rebuild when HEAD moves: HEAD itself (branch switch, detached checkout)
    // and the branch ref it names (a commit on the branch).
    // A path that does not exist would make cargo rerun this script on every
    // build, so only existing ones are named.
    let branch = git(workspace, &["symbolic-ref", "-q", "HEAD"]);
    let names = ["HEAD", "packed-refs"].into_iter().chain(branch.as_deref());
    for name in names {
        if let Some(p) = git(workspace, &["rev-parse", "--git-path", name]) {
            let p = workspace.join(p);
            if p.exists() {
                println!("cargo::rerun-if-changed={}", p.display());
            }
        }
    }
    git(workspace, &["rev-parse", "--short=12", "HEAD"])
}
