//! `gpuwatch-demo` integration tests: one test binary. The demo runs the real
//! agent, so it is built first, with the nvml-sim library, into the profile
//! directory of this crate's binary (`cargo build -p gpuwatch -p nvml-sim`:
//! they cannot be dependencies of this package; a no-op when fresh).

mod e2e;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The repository root.
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The `gpuwatch` binary, built once per test process beside `gpuwatch-demo`
/// together with `libnvml_sim.so` (one cargo invocation, as
/// `deploy/image/build.sh` does, so both resolve the same features). Target
/// flags apply to every package named: `--bin gpuwatch` alone would build
/// no target of nvml-sim, hence `--lib`.
fn agent_binary() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        // target/<profile>/gpuwatch-demo → target/<profile>
        let profile_dir = Path::new(env!("CARGO_BIN_EXE_gpuwatch-demo"))
            .parent()
            .expect("target/<profile> directory")
            .to_path_buf();
        let mut cmd = Command::new(env!("CARGO"));
        cmd.current_dir(workspace()).args([
            "build", "-q", "-p", "gpuwatch", "-p", "nvml-sim", "--bin", "gpuwatch", "--lib",
        ]);
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let out = cmd
            .output()
            .expect("run cargo build -p gpuwatch -p nvml-sim");
        assert!(
            out.status.success(),
            "cargo build -p gpuwatch -p nvml-sim failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        for built in ["gpuwatch", "libnvml_sim.so"] {
            let path = profile_dir.join(built);
            assert!(path.is_file(), "{} missing after the build", path.display());
        }
        profile_dir.join("gpuwatch")
    })
}
