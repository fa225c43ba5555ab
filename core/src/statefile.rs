//! Atomic state files: write to a temporary file in the same directory, fsync,
//! rename over the old one, fsync the directory. A reader sees the old or the
//! new content, never a torn write.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Errors reading or writing a state file.
#[derive(Debug, thiserror::Error)]
pub enum StateFileError {
    /// The file could not be written.
    #[error("cannot write state file {path}: {source}")]
    Write {
        /// The state file (its temporary sibling is removed on failure).
        path: PathBuf,
        /// The failed step's error (create, write, fsync, rename, encode).
        #[source]
        source: std::io::Error,
    },
    /// The file could not be read.
    #[error("cannot read state file {path}: {source}")]
    Read {
        /// The state file.
        path: PathBuf,
        /// The read error (never `NotFound`: a missing file is `Ok(None)`).
        #[source]
        source: std::io::Error,
    },
    /// The state at the path cannot be used (corrupt, newer version, not a
    /// file, unreadable); it was moved aside to `kept_as`.
    #[error("state file {path} is unusable ({reason}); moved aside to {kept_as}")]
    Corrupt {
        /// Where the state was (nothing is there now).
        path: PathBuf,
        /// What was wrong.
        reason: String,
        /// Where the bad file now is.
        kept_as: PathBuf,
    },
}

/// Writes `bytes` to `path` atomically.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), StateFileError> {
    let err = |source| StateFileError::Write {
        path: path.to_path_buf(),
        source,
    };
    let dir = path.parent().unwrap_or_else(|| Path::new("."));
    fs::create_dir_all(dir).map_err(err)?;
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "state".into());
    let tmp = dir.join(format!(".{file_name}.tmp.{}", std::process::id()));
    let result = (|| {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)?;
        if let Ok(d) = File::open(dir) {
            // Directory fsync makes the rename durable; not all filesystems allow it.
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.map_err(err)
}

/// Reads `path`. `Ok(None)` when it does not exist.
pub fn read(path: &Path) -> Result<Option<Vec<u8>>, StateFileError> {
    match fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(StateFileError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Reads and decodes a JSON state file. A file that does not decode is moved
/// aside (`<name>.corrupt-<unix secs>`) and reported as [`StateFileError::Corrupt`];
/// the caller logs it and starts fresh.
pub fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Option<T>, StateFileError> {
    let Some(bytes) = read(path)? else {
        return Ok(None);
    };
    match serde_json::from_slice(&bytes) {
        Ok(v) => Ok(Some(v)),
        Err(e) => Err(keep_aside(path, "corrupt", e.to_string())),
    }
}

/// Moves a state that cannot be used (a file or whatever else is at `path`)
/// aside as `<stem>.<what>-<unix secs>` (`health.json` → `health.newer-…`),
/// so that nothing is lost and the next write starts afresh.
/// [`StateFileError::Corrupt`] with `reason` when it was moved,
/// [`StateFileError::Write`] when it could not be (it is still there).
pub fn keep_aside(path: &Path, what: &str, reason: String) -> StateFileError {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let kept_as = path.with_extension(format!("{what}-{secs}"));
    match fs::rename(path, &kept_as) {
        Ok(()) => StateFileError::Corrupt {
            path: path.to_path_buf(),
            reason,
            kept_as,
        },
        Err(source) => StateFileError::Write {
            path: path.to_path_buf(),
            source,
        },
    }
}

/// Encodes `value` as pretty JSON and writes it atomically.
pub fn write_json<T: serde::Serialize>(path: &Path, value: &T) -> Result<(), StateFileError> {
    let bytes = serde_json::to_vec_pretty(value).map_err(|e| StateFileError::Write {
        path: path.to_path_buf(),
        source: std::io::Error::other(e),
    })?;
    write_atomic(path, &bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_corrupt_file_kept_aside() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s.json");
        assert!(read_json::<Vec<u32>>(&p).unwrap().is_none());
        write_json(&p, &vec![1u32, 2]).unwrap();
        assert_eq!(read_json::<Vec<u32>>(&p).unwrap(), Some(vec![1, 2]));
        fs::write(&p, b"{not json").unwrap();
        match read_json::<Vec<u32>>(&p) {
            Err(StateFileError::Corrupt { kept_as, .. }) => {
                assert!(kept_as.exists());
                assert!(!p.exists());
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
    }
}
