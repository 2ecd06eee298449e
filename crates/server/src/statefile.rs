//! The daemon's small JSON state files (`imported.json`, `targets.json`): read with a clear
//! error when corrupt, written crash-safely.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Reads `path`; a missing file is the default value. `advice` ends the message for a corrupt one.
pub fn read_json<T: DeserializeOwned + Default>(path: &Path, advice: &str) -> Result<T, String> {
    match std::fs::read(path) {
        Ok(b) => serde_json::from_slice(&b).map_err(|e| format!("{} is corrupt ({e}); {advice}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(T::default()),
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

/// Replaces `path` with `value`: write a temporary file, sync it, rename it over, sync the
/// directory. A crash leaves the old file or the new one, never a torn one.
pub fn write_json<T: Serialize>(path: &Path, value: &T) -> std::io::Result<()> {
    let tmp = path.with_extension("json.tmp");
    // Owner only: targets.json holds CHAP secrets.
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(&serde_json::to_vec_pretty(value).expect("serializable"))?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_is_default_corrupt_is_an_error_and_writes_round_trip() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.json");
        assert_eq!(read_json::<Vec<u32>>(&p, "fix it").unwrap(), Vec::<u32>::new());
        write_json(&p, &vec![1u32, 2]).unwrap();
        assert_eq!(read_json::<Vec<u32>>(&p, "fix it").unwrap(), vec![1, 2]);
        assert!(!p.with_extension("json.tmp").exists());
        std::fs::write(&p, b"{nope").unwrap();
        let e = read_json::<Vec<u32>>(&p, "fix it").unwrap_err();
        assert!(e.contains("is corrupt") && e.ends_with("fix it"), "{e}");
    }
}
