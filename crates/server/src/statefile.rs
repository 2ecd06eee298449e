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

/// Changes `state` with `change`, then saves it with `save`; if either fails, `state` is put
/// back as it was, so that what is in memory never differs from what is on disk. For the small
/// maps of the state directory (targets, exports): the copy it keeps costs nothing.
pub fn change_saved<T: Clone, R, E>(
    state: &mut T,
    change: impl FnOnce(&mut T) -> Result<R, E>,
    save: impl FnOnce(&T) -> Result<(), E>,
) -> Result<R, E> {
    let before = state.clone();
    let done = change(state).and_then(|r| save(state).map(|()| r));
    if done.is_err() {
        *state = before;
    }
    done
}

#[cfg(test)]
mod change_saved_tests {
    use super::change_saved;
    use std::collections::BTreeMap;

    #[test]
    fn a_failed_change_or_save_leaves_the_state_as_it_was() {
        let mut m: BTreeMap<u32, String> = BTreeMap::from([(1, "a".into())]);
        let saved = change_saved(&mut m, |m| Ok::<_, String>(m.insert(2, "b".into())), |_| Ok(()));
        assert_eq!(saved, Ok(None));
        assert_eq!(m.len(), 2);
        let failed_save = change_saved(&mut m, |m| Ok(m.remove(&1)), |_| Err("disk full".to_string()));
        assert_eq!(failed_save, Err("disk full".to_string()));
        assert_eq!(m.get(&1).map(String::as_str), Some("a"));
        let failed_change: Result<(), String> = change_saved(
            &mut m,
            |m| {
                m.clear();
                Err("refused half way".to_string())
            },
            |_| Ok(()),
        );
        assert!(failed_change.is_err());
        assert_eq!(m.len(), 2);
    }
}
