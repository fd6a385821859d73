//! The data directory: checked and locked before the agent starts.
//!
//! Two agents on one data directory would both read every file and both
//! deliver every line, each committing over the other's checkpoints. An
//! exclusive `flock` on `petrel.lock` (released by the kernel when the
//! process dies, even by kill -9) refuses the second one.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::io::AsRawFd;
use std::path::Path;

/// Name of the lock file inside the data directory.
pub const LOCK_FILE: &str = "petrel.lock";

/// Held for the life of the process; dropping it releases the lock.
#[derive(Debug)]
pub struct DataDirLock {
    _file: File,
}

/// Creates `dir` if needed, checks it is writable, and takes its lock.
/// Errors say what is wrong and how to choose another directory.
pub fn lock(dir: &Path) -> anyhow::Result<DataDirLock> {
    let hint =
        "choose another with --data-dir or PETREL_DATA_DIR, or run as a user who may write there";
    std::fs::create_dir_all(dir)
        .map_err(|e| anyhow::anyhow!("cannot create data dir {}: {e}; {hint}", dir.display()))?;
    let path = dir.join(LOCK_FILE);
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| anyhow::anyhow!("data dir {} is not writable ({e}); {hint}", dir.display()))?;
    // SAFETY: flock on a descriptor we own for the duration of the call.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = holder.trim();
            let who = if holder.is_empty() {
                "another petrel process".to_string()
            } else {
                format!("petrel process {holder}")
            };
            anyhow::bail!(
                "data dir {} is in use by {who}: two agents on one data dir would deliver every line twice; stop it first, or give this one its own --data-dir",
                dir.display()
            );
        }
        anyhow::bail!("cannot lock {}: {err}", path.display());
    }
    // Checkpoints are written next to the lock: prove that works now
    // rather than at the first checkpoint, after data was already read.
    let write_pid = |f: &mut File| -> std::io::Result<()> {
        f.set_len(0)?;
        f.seek(SeekFrom::Start(0))?;
        writeln!(f, "{}", std::process::id())?;
        f.sync_data()
    };
    write_pid(&mut file)
        .map_err(|e| anyhow::anyhow!("data dir {} is not writable ({e}); {hint}", dir.display()))?;
    let probe = dir.join(".petrel-write-test");
    std::fs::write(&probe, b"ok")
        .and_then(|_| std::fs::remove_file(&probe))
        .map_err(|e| anyhow::anyhow!("data dir {} is not writable ({e}); {hint}", dir.display()))?;
    Ok(DataDirLock { _file: file })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_is_refused_with_the_holder_pid() {
        let d = tempfile::tempdir().expect("tempdir");
        let first = lock(d.path()).expect("first lock");
        // flock locks belong to the open file description, so a second
        // open in the same process conflicts like another process would.
        let err = lock(d.path()).expect_err("second lock must fail");
        let msg = err.to_string();
        assert!(msg.contains("in use by petrel process"), "{msg}");
        assert!(msg.contains(&std::process::id().to_string()), "{msg}");
        drop(first);
        lock(d.path()).expect("free again after drop");
    }
}
