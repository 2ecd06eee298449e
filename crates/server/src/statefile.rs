//! The daemon's small JSON state files (`imported.json`, `targets.json`): read with a clear
//! error when corrupt, written crash-safely.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use serde::de::DeserializeOwned;
use serde::Serialize;

/// The newest format of a state file this daemon reads, from a file's `format` key. A file
/// that gains something an older daemon would not know, and would drop at its next save (as
/// `targets.json` gained per-initiator CHAP credentials), is written with the next number
/// ([`write_json_as`]): a daemon refuses a file of a newer format rather than serve part of
/// it and then write it back without the rest. A file without the key is of format 0: the
/// others are written so, which the daemons before the key read as well.
pub const STATE_FORMAT: u64 = 1;
const FORMAT_KEY: &str = "format";

/// Reads `path`; a missing file is the default value. `advice` ends the message for a corrupt one.
pub fn read_json<T: DeserializeOwned + Default>(path: &Path, advice: &str) -> Result<T, String> {
    let corrupt = |e: serde_json::Error| format!("{} is corrupt ({e}); {advice}", path.display());
    let mut value: serde_json::Value = match std::fs::read(path) {
        Ok(b) => serde_json::from_slice(&b).map_err(corrupt)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(T::default()),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    if let Some(fields) = value.as_object_mut() {
        match fields.remove(FORMAT_KEY).map(|f| f.as_u64()) {
            None => {}
            Some(Some(f)) if f <= STATE_FORMAT => {}
            Some(Some(f)) => {
                return Err(format!(
                    "{} was written by a newer Tessera (state format {f}; this one reads up to {STATE_FORMAT}): \
                     run that version again, or move the file away to start without it",
                    path.display()
                ))
            }
            Some(None) => {
                return Err(format!(
                    "{} is corrupt (its format is not a number); {advice}",
                    path.display()
                ))
            }
        }
    }
    serde_json::from_value(value).map_err(corrupt)
}

/// Replaces `path` with `value`: write a temporary file, sync it, rename it over, sync the
/// directory. A crash leaves the old file or the new one, never a torn one. Of format 0.
pub fn write_json<T: Serialize>(path: &Path, value: &T) -> std::io::Result<()> {
    write_json_as(path, value, 0)
}

/// [`write_json`], saying the file's `format` (0: none).
pub fn write_json_as<T: Serialize>(path: &Path, value: &T, format: u64) -> std::io::Result<()> {
    let tmp = path.with_extension("json.tmp");
    // Owner only: targets.json holds CHAP secrets.
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    let mut json = serde_json::to_value(value).expect("serializable");
    if let Some(fields) = json.as_object_mut().filter(|_| format > 0) {
        fields.insert(FORMAT_KEY.into(), format.into());
    }
    let written = f
        .write_all(&serde_json::to_vec_pretty(&json).expect("serializable"))
        .and_then(|()| f.sync_all());
    if let Err(e) = written {
        // A full file system: what was written of it goes, the old file stays.
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
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

    #[derive(Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Saved {
        names: Vec<String>,
    }

    /// A file says the format it was written in; one of a newer format is refused (a newer
    /// daemon's file holds what this one would drop at its next save), one of no format (an
    /// older daemon's) is read.
    #[test]
    fn a_file_of_a_newer_format_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.json");
        let s = Saved {
            names: vec!["a".into()],
        };
        write_json_as(&p, &s, STATE_FORMAT).unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(text.contains(&format!("\"format\": {STATE_FORMAT}")), "{text}");
        assert_eq!(read_json::<Saved>(&p, "fix it").unwrap(), s);
        write_json(&p, &s).unwrap();
        assert!(
            !std::fs::read_to_string(&p).unwrap().contains("format"),
            "format 0 says none"
        );
        std::fs::write(&p, r#"{"names":["b"]}"#).unwrap();
        assert_eq!(read_json::<Saved>(&p, "fix it").unwrap().names, vec!["b".to_string()]);
        std::fs::write(&p, format!(r#"{{"names":["c"],"format":{}}}"#, STATE_FORMAT + 1)).unwrap();
        let e = read_json::<Saved>(&p, "fix it").unwrap_err();
        assert!(e.contains("newer Tessera"), "{e}");
        std::fs::write(&p, r#"{"names":["c"],"format":"2"}"#).unwrap();
        let e = read_json::<Saved>(&p, "fix it").unwrap_err();
        assert!(e.contains("is corrupt"), "{e}");
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
