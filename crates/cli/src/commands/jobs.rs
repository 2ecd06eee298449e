//! `tessera job`, and following a job's progress.

use super::*;

pub(super) fn job(c: &Ctx, cmd: JobCmd) -> R {
    match cmd {
        JobCmd::List => {
            let v = c.client.get("/api/jobs")?;
            if c.json {
                c.print_json(&v);
            } else {
                let rows = arr(&v)
                    .iter()
                    .map(|j| {
                        vec![
                            s(&j["id"]),
                            s(&j["kind"]),
                            s(&j["target"]),
                            s(&j["state"]),
                            percent(
                                j["done_bytes"].as_u64().unwrap_or(0),
                                j["total_bytes"].as_u64().unwrap_or(0),
                            ),
                            size(&j["total_bytes"]),
                            format!("{:.1}s", j["elapsed_seconds"].as_f64().unwrap_or(0.0)),
                            j["error"].as_str().unwrap_or("").to_string(),
                        ]
                    })
                    .collect();
                table(
                    &["ID", "KIND", "TARGET", "STATE", "DONE", "BYTES", "ELAPSED", "ERROR"],
                    rows,
                );
            }
        }
        JobCmd::Show { id } => {
            let v = c.client.get(&format!("/api/jobs/{id}"))?;
            if c.json {
                c.print_json(&v);
            } else {
                show_job(&v);
            }
        }
        JobCmd::Wait { id } => {
            let v = c.client.get(&format!("/api/jobs/{id}"))?;
            follow(c, v, false)?;
        }
        JobCmd::Cancel { id } => {
            let v = c.client.post(&format!("/api/jobs/{id}/cancel"), None)?;
            if c.json {
                c.print_json(&v);
            } else {
                println!("job {id}: cancel requested");
            }
        }
    }
    Ok(())
}

pub(super) fn show_job(v: &Value) {
    let mut pairs = vec![
        ("job", s(&v["id"])),
        ("kind", s(&v["kind"])),
        ("target", s(&v["target"])),
        ("state", s(&v["state"])),
        (
            "progress",
            format!(
                "{} of {} ({})",
                size(&v["done_bytes"]),
                size(&v["total_bytes"]),
                percent(
                    v["done_bytes"].as_u64().unwrap_or(0),
                    v["total_bytes"].as_u64().unwrap_or(0)
                )
            ),
        ),
        (
            "rate",
            format!("{}/s", format_size(v["rate"].as_f64().unwrap_or(0.0) as u64)),
        ),
        (
            "elapsed",
            format!("{:.1}s", v["elapsed_seconds"].as_f64().unwrap_or(0.0)),
        ),
    ];
    if let Some(e) = v["eta_seconds"].as_f64() {
        pairs.push(("eta", format!("{e:.0}s")));
    }
    if let Some(e) = v["error"].as_str() {
        pairs.push(("error", e.to_string()));
    }
    if !v["result"].is_null() {
        pairs.push(("result", v["result"].to_string()));
    }
    kv(&pairs);
}

/// Follows a job to its end with a progress bar (on a terminal), unless `no_wait`. A job that
/// fails or is cancelled makes the command fail.
pub(super) fn follow(c: &Ctx, job: Value, no_wait: bool) -> R {
    let id = job["id"]
        .as_u64()
        .ok_or_else(|| ClientError::Transport("the daemon did not return a job".into()))?;
    if no_wait {
        if c.json {
            c.print_json(&job);
        } else {
            println!(
                "job {id} started ({} of {}); 'tessera job wait {id}' follows it",
                s(&job["kind"]),
                s(&job["target"])
            );
        }
        return Ok(());
    }
    let bar = if std::io::stderr().is_terminal() && !c.json {
        let b = ProgressBar::new(job["total_bytes"].as_u64().unwrap_or(0));
        b.set_style(
            ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta} ")
                .expect("valid template")
                .progress_chars("=> "),
        );
        b.set_message(format!("job {id} {} {}", s(&job["kind"]), s(&job["target"])));
        Some(b)
    } else {
        None
    };
    let mut v = job;
    loop {
        if let Some(b) = &bar {
            b.set_length(v["total_bytes"].as_u64().unwrap_or(0));
            b.set_position(v["done_bytes"].as_u64().unwrap_or(0));
        }
        if v["state"] != "running" {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
        v = c.client.get(&format!("/api/jobs/{id}"))?;
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    if c.json {
        c.print_json(&v);
    }
    match v["state"].as_str() {
        Some("succeeded") => {
            if !c.json {
                println!(
                    "job {id} ({} of {}) succeeded: {} in {:.1}s",
                    s(&v["kind"]),
                    s(&v["target"]),
                    size(&v["total_bytes"]),
                    v["elapsed_seconds"].as_f64().unwrap_or(0.0)
                );
            }
            Ok(())
        }
        _ => Err(ClientError::Transport(format!(
            "job {id} ({} of {}) {}: {}",
            s(&v["kind"]),
            s(&v["target"]),
            s(&v["state"]),
            v["error"].as_str().unwrap_or("no reason given")
        ))),
    }
}
