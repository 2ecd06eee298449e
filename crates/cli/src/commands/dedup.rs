//! `tessera dedup`: a pool's deduplication settings, runs, garbage collection and savings.

use tessera_server::units::format_duration;

use super::*;

pub(super) fn dedup(c: &Ctx, cmd: DedupCmd) -> R {
    let path = |pool: &str, what: &str| format!("/api/pools/{}/dedup{what}", encode_segment(pool));
    match cmd {
        DedupCmd::Enable {
            pool,
            vdisks,
            exclude,
            min_age,
            schedule,
            background_rate,
            compression,
            hot_copy_refs,
        } => {
            let req = SetDedup {
                enabled: Some(true),
                vdisks: Some(vdisks),
                exclude: Some(exclude),
                min_age_secs: min_age,
                schedule_secs: schedule,
                background_rate,
                compression: compression.map(|c| match c {
                    CompressionArg::Zstd => Compression::Zstd,
                    CompressionArg::Lz4 => Compression::Lz4,
                    CompressionArg::Balanced => Compression::Balanced,
                    CompressionArg::Off => Compression::Off,
                }),
                hot_copy_refs,
            };
            let v = c.client.put(&path(&pool, ""), body(&req))?;
            c.answer(v, |s: DedupStatus| {
                print_settings(&s);
                Ok(())
            })
        }
        DedupCmd::Disable { pool } => {
            let req = SetDedup {
                enabled: Some(false),
                ..Default::default()
            };
            let v = c.client.put(&path(&pool, ""), body(&req))?;
            c.answer(v, |_: DedupStatus| {
                println!("pool {pool}: dedup off (what is shared stays shared)");
                Ok(())
            })
        }
        DedupCmd::Run {
            pool,
            mode,
            rate,
            all,
            no_wait,
        } => {
            let req = PassOptions {
                mode: match mode {
                    DedupModeArg::Throughput => DedupMode::Throughput,
                    DedupModeArg::Background => DedupMode::Background,
                },
                rate,
                ignore_min_age: all,
            };
            let v = c.client.post(&path(&pool, "/run"), body(&req))?;
            follow_and_report(c, v, no_wait)
        }
        DedupCmd::Gc { pool, no_wait } => {
            let v = c.client.post(&path(&pool, "/gc"), None)?;
            follow(c, v, no_wait)
        }
        DedupCmd::Status { pool } => {
            let v = c.client.get(&path(&pool, ""))?;
            c.answer(v, |s: DedupStatus| {
                print_status(&s);
                Ok(())
            })
        }
    }
}

/// Follows a run, then prints what it did.
fn follow_and_report(c: &Ctx, v: Value, no_wait: bool) -> R {
    if no_wait || c.json {
        return follow(c, v, no_wait);
    }
    let (job, _) = super::jobs::wait_for(c, v)?;
    if job.state != JobState::Succeeded {
        return Err(ClientError::Transport(format!(
            "job {} (dedup of {}) {}: {}",
            job.id,
            job.target,
            job.state.as_str(),
            job.error.as_deref().unwrap_or("no reason given")
        )));
    }
    let r: PassReport = read(job.result.clone().unwrap_or_default())?;
    kv(&[
        ("vdisks", r.vdisks.to_string()),
        (
            "scanned",
            format!("{} ({} grains)", size(r.bytes_scanned), r.grains_scanned),
        ),
        ("shared", format!("{} grains", r.grains_shared)),
        ("zeros unmapped", format!("{} grains", r.zero_grains_unmapped)),
        ("too young", format!("{} grains", r.grains_too_young)),
        (
            "unreadable",
            format!("{} grains (left as they are)", r.grains_unreadable),
        ),
        ("mismatches", r.mismatches.to_string()),
        (
            "compressed",
            format!(
                "{} grains, {} into {}",
                r.grains_compressed,
                size(r.compressed_bytes_in),
                size(r.compressed_bytes_out)
            ),
        ),
        (
            "hot copies",
            format!("{} made, {} dropped", r.hot_copies_made, r.hot_copies_dropped),
        ),
        ("rate", format!("{:.1} MB/s in {:.1}s", r.mb_per_s, r.seconds)),
    ]);
    Ok(())
}

fn print_settings(s: &DedupStatus) {
    let st = &s.settings;
    let scope = if st.vdisks.is_empty() {
        "every vdisk".to_string()
    } else {
        st.vdisks.join(", ")
    };
    kv(&[
        ("pool", s.pool.clone()),
        (
            "dedup",
            match &s.settings_unreadable {
                Some(why) => format!("off: {why}"),
                None => if st.enabled { "on" } else { "off" }.into(),
            },
        ),
        ("scope", scope),
        (
            "excluded",
            if st.exclude.is_empty() {
                "-".into()
            } else {
                st.exclude.join(", ")
            },
        ),
        ("minimum age", format_duration(Duration::from_secs(st.min_age_secs))),
        (
            "schedule",
            match st.schedule_secs {
                0 => "none".into(),
                n => format!(
                    "every {} (background, {}/s)",
                    format_duration(Duration::from_secs(n)),
                    format_size(st.background_rate)
                ),
            },
        ),
        ("compression", st.compression.name().into()),
        (
            "hot copies",
            match st.hot_copy_refs {
                0 => "none".into(),
                n => format!("of blocks shared more than {n} times, on layouts with no redundancy"),
            },
        ),
    ]);
}

fn print_status(s: &DedupStatus) {
    print_settings(s);
    kv(&[
        ("logical", size(s.logical_bytes)),
        ("physical", size(s.physical_bytes)),
        (
            "saved",
            format!("{} ({:.1} %)", size(s.saved_bytes), s.saved_ratio * 100.0),
        ),
        (
            "compressed",
            if s.packed_bytes == 0 {
                "-".into()
            } else {
                format!(
                    "{} in {} ({:.2}x)",
                    size(s.compressed_bytes),
                    size(s.packed_bytes),
                    s.compression_ratio
                )
            },
        ),
        (
            "hot copies",
            if s.hot_copies == 0 {
                "-".into()
            } else {
                format!("{} ({})", s.hot_copies, size(s.hot_copy_bytes))
            },
        ),
        (
            "index",
            format!(
                "{} entries, {} in memory, {} on disk",
                s.index.entries,
                size(s.index.memory_bytes),
                size(s.index.disk_bytes)
            ),
        ),
    ]);
    let rows = s
        .vdisks
        .iter()
        .map(|v| {
            vec![
                v.name.clone(),
                if v.in_scope { "yes" } else { "no" }.into(),
                size(v.grain_size),
                size(v.logical_bytes),
                size(v.physical_bytes),
                size(v.saved_bytes),
                percent(v.saved_bytes, v.logical_bytes),
            ]
        })
        .collect();
    println!();
    table(
        &["VDISK", "IN SCOPE", "GRAIN", "LOGICAL", "PHYSICAL", "SAVED", "RATE"],
        rows,
    );
}
