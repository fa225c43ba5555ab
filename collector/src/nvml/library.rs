//! Which NVML library to load: the system one, a configured one, or a private
//! copy of the nvml-sim cdylib with its scenario side file.

use super::watchdog::CallWatch;
use super::{NvmlError, NvmlSettings};
use nvml_wrapper::Nvml;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// File name of the nvml-sim cdylib.
pub(crate) const SIM_LIB_NAME: &str = "libnvml_sim.so";
/// Environment variable naming the nvml-sim cdylib.
pub(crate) const SIM_LIB_ENV: &str = "GPUWATCH_NVML_SIM_LIB";
/// The system NVML library.
const SYSTEM_LIB: &str = "libnvidia-ml.so.1";
/// Suffix of the side file nvml-sim reads its scenario path from.
const SIDE_FILE_SUFFIX: &str = ".scenario";

/// A library choice; holds the simulator's private directory while alive.
#[derive(Debug)]
pub(super) struct Library {
    path: PathBuf,
    sim_dir: Option<PathBuf>,
}

static SIM_COPIES: AtomicU64 = AtomicU64::new(0);

impl Library {
    /// Resolves the configuration to a library (creating the simulator copy).
    pub(super) fn choose(cfg: &NvmlSettings) -> Result<Library, NvmlError> {
        let Some(scenario) = &cfg.sim_scenario else {
            let path = cfg
                .library_path
                .clone()
                .unwrap_or_else(|| PathBuf::from(SYSTEM_LIB));
            return Ok(Library {
                path,
                sim_dir: None,
            });
        };
        let scenario =
            std::fs::canonicalize(scenario).map_err(|source| NvmlError::SimScenario {
                path: scenario.clone(),
                source,
            })?;
        let src = match &cfg.library_path {
            Some(p) => p.clone(),
            None => find_sim_library()?,
        };
        let dir = std::env::temp_dir().join(format!(
            "gpuwatch-nvml-sim-{}-{}",
            std::process::id(),
            SIM_COPIES.fetch_add(1, Ordering::Relaxed)
        ));
        let setup = |dir: &Path| -> std::io::Result<PathBuf> {
            // A leftover from a crashed run with the same pid is replaced.
            let _ = std::fs::remove_dir_all(dir);
            std::fs::create_dir_all(dir)?;
            let lib = dir.join(SIM_LIB_NAME);
            std::fs::copy(&src, &lib)?;
            let mut side = lib.clone().into_os_string();
            side.push(SIDE_FILE_SUFFIX);
            std::fs::write(PathBuf::from(side), format!("{}\n", scenario.display()))?;
            Ok(lib)
        };
        match setup(&dir) {
            Ok(path) => Ok(Library {
                path,
                sim_dir: Some(dir),
            }),
            Err(source) => {
                let _ = std::fs::remove_dir_all(&dir);
                Err(NvmlError::SimSetup { dir, source })
            }
        }
    }

    /// The path loaded.
    pub(super) fn path(&self) -> &Path {
        &self.path
    }
}

/// Loads the library at `path` and initialises NVML, as one watched call
/// (`dlopen` and `nvmlInit_v2` both may block in a wedged driver).
pub(super) fn init(path: &Path, watch: &CallWatch) -> Result<Nvml, NvmlError> {
    let library = path.display().to_string();
    watch
        .call("nvmlInit_v2", || {
            Nvml::builder().lib_path(path.as_os_str()).init()
        })
        .map_err(|source| match source {
            nvml_wrapper::error::NvmlError::LibloadingError(_)
            | nvml_wrapper::error::NvmlError::FailedToLoadSymbol(_) => {
                NvmlError::Load { library, source }
            }
            source => NvmlError::Init { library, source },
        })
}

impl Drop for Library {
    fn drop(&mut self) {
        if let Some(dir) = &self.sim_dir
            && let Err(e) = std::fs::remove_dir_all(dir)
        {
            tracing::debug!(dir = %dir.display(), error = %e, "Cannot remove the nvml-sim directory.");
        }
    }
}

/// Looks for `libnvml_sim.so`: `$GPUWATCH_NVML_SIM_LIB`, next to the executable,
/// in its parent directory (`target/debug/deps/..`), in `target/{debug,release}`.
fn find_sim_library() -> Result<PathBuf, NvmlError> {
    let mut candidates = Vec::new();
    if let Some(p) = std::env::var_os(SIM_LIB_ENV).filter(|p| !p.is_empty()) {
        candidates.push(PathBuf::from(p));
    }
    if let Ok(exe) = std::env::current_exe()
        && let Some(dir) = exe.parent()
    {
        candidates.push(dir.join(SIM_LIB_NAME));
        if let Some(parent) = dir.parent() {
            candidates.push(parent.join(SIM_LIB_NAME));
        }
    }
    for profile in ["debug", "release"] {
        candidates.push(Path::new("target").join(profile).join(SIM_LIB_NAME));
    }
    if let Some(found) = candidates.iter().find(|p| p.is_file()) {
        return Ok(found.clone());
    }
    Err(NvmlError::SimLibraryNotFound {
        searched: candidates
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
    })
}
