//! `tessera job`, and following a job's progress.

use super::*;
use std::time::Instant;

pub(super) fn job(c: &Ctx, cmd: JobCmd) -> R {
    match cmd {
        JobCmd::List => {
            let v = c.client.get("/api/jobs")?;
            c.answer(v, |jobs: Vec<JobView>| {
                let rows = jobs
                    .iter()
                    .map(|j| {
                        vec![
                            j.id.to_string(),
                            j.kind.clone(),
                            j.target.clone(),
                            j.state.as_str().to_string(),
                            percent(j.done_bytes, j.total_bytes),
                            size(j.total_bytes),
                            format!("{:.1}s", j.elapsed_seconds),
                            j.error.clone().unwrap_or_default(),
                        ]
                    })
                    .collect();
                table(
                    &["ID", "KIND", "TARGET", "STATE", "DONE", "BYTES", "ELAPSED", "ERROR"],
                    rows,
                );
                Ok(())
            })?;
        }
        JobCmd::Show { id } => {
            let v = c.client.get(&format!("/api/jobs/{id}"))?;
            c.answer(v, |j: JobView| {
                show_job(&j);
                Ok(())
            })?;
        }
        JobCmd::Wait { id } => {
            let v = c.client.get(&format!("/api/jobs/{id}"))?;
            follow(c, v, false)?;
        }
        JobCmd::Cancel { id } => {
            let v = c.client.post(&format!("/api/jobs/{id}/cancel"), None)?;
            c.answer(v, |_: JobView| {
                println!("job {id}: cancel requested");
                Ok(())
            })?;
        }
    }
    Ok(())
}

pub(super) fn show_job(j: &JobView) {
    let mut pairs = vec![
        ("job", j.id.to_string()),
        ("kind", j.kind.clone()),
        ("target", j.target.clone()),
        ("state", j.state.as_str().to_string()),
        (
            "progress",
            format!(
                "{} of {} ({})",
                size(j.done_bytes),
                size(j.total_bytes),
                percent(j.done_bytes, j.total_bytes)
            ),
        ),
        ("rate", format!("{}/s", format_size(j.rate as u64))),
        ("elapsed", format!("{:.1}s", j.elapsed_seconds)),
    ];
    if let Some(e) = j.eta_seconds {
        pairs.push(("eta", format!("{e:.0}s")));
    }
    if let Some(e) = &j.error {
        pairs.push(("error", e.clone()));
    }
    if let Some(r) = &j.result {
        pairs.push(("result", r.to_string()));
    }
    kv(&pairs);
}

/// Follows a job to its end with a progress bar (on a terminal), unless `no_wait`. A job that
/// fails or is cancelled makes the command fail.
pub(super) fn follow(c: &Ctx, raw: Value, no_wait: bool) -> R {
    let job: JobView = read(raw.clone())?;
    let id = job.id;
    if no_wait {
        if c.json {
            c.print_json(&raw);
        } else {
            println!(
                "job {id} started ({} of {}); 'tessera job wait {id}' follows it",
                job.kind, job.target
            );
        }
        return Ok(());
    }
    let (job, raw) = wait_for(c, raw)?;
    if c.json {
        c.print_json(&raw);
    }
    match job.state {
        JobState::Succeeded => {
            if !c.json {
                println!(
                    "job {id} ({} of {}) succeeded: {} in {:.1}s",
                    job.kind,
                    job.target,
                    size(job.total_bytes),
                    job.elapsed_seconds
                );
            }
            Ok(())
        }
        s => {
            let why = job.error.as_deref().unwrap_or("no reason given");
            // A job the daemon cancelled says so in its reason ("cancelled: ...").
            let told = match why.strip_prefix(s.as_str()) {
                Some(rest) if rest.is_empty() || rest.starts_with(':') => why.to_string(),
                _ => format!("{}: {why}", s.as_str()),
            };
            Err(ClientError::Transport(format!(
                "job {id} ({} of {}) {told}",
                job.kind, job.target
            )))
        }
    }
}

/// How long one request for a running job waits for its end.
const POLL: Duration = Duration::from_millis(200);

/// Polls a job until it ends, with a progress bar on a terminal. Returns its last view.
pub(super) fn wait_for(c: &Ctx, mut raw: Value) -> Result<(JobView, Value), ClientError> {
    let mut job: JobView = read(raw.clone())?;
    let id = job.id;
    let bar = if std::io::stderr().is_terminal() && !c.json {
        let b = ProgressBar::new(job.total_bytes);
        // Scans and spot-fixes count metadata records, not bytes.
        let template = match job.kind.as_str() {
            "scan" | "spotfix" | "dedup-gc" => "{msg} [{bar:30}] {human_pos}/{human_len} records {per_sec} ETA {eta} ",
            _ => "{msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta} ",
        };
        b.set_style(
            ProgressStyle::with_template(template)
                .expect("valid template")
                .progress_chars("=> "),
        );
        b.set_message(format!("job {id} {} {}", job.kind, job.target));
        Some(b)
    } else {
        None
    };
    loop {
        if let Some(b) = &bar {
            b.set_length(job.total_bytes);
            b.set_position(job.done_bytes);
        }
        if job.state != JobState::Running {
            break;
        }
        // The daemon answers once the job ended or after POLL, whichever comes first: the
        // progress moves five times a second, and the end is seen when it comes.
        let asked = Instant::now();
        raw = c.client.get(&format!("/api/jobs/{id}?wait={}", POLL.as_secs_f64()))?;
        job = read(raw.clone())?;
        // A daemon that answered at once although the job runs on (one that does not wait)
        // is asked again only after POLL.
        if job.state == JobState::Running {
            std::thread::sleep(POLL.saturating_sub(asked.elapsed()));
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    Ok((job, raw))
}
