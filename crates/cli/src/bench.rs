//! `tessera bench`: runs a workload against targets and reports, without the daemon's API
//! (network targets are reached directly; a vdisk is opened in this process).

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tessera_bench::report::{compare, human, Summary};
use tessera_bench::{run, Connect, Target, TargetSpec, Verifier, Workload};
use tessera_server::daemon::open_disk;
use tessera_server::lock::StateLock;
use tessera_volume::Engine;

use crate::BenchArgs;

/// A vdisk opened in this process, with what keeps it valid.
struct Local {
    _lock: StateLock,
    _engine: Arc<Engine>,
}

fn open_vdisk(state_dir: &Path, pool: &str, name: &str) -> Result<(Target, Local), String> {
    let lock = StateLock::acquire(state_dir)
        .map_err(|e| format!("{e}. A running daemon's vdisks are benchmarked through nbd:// or iscsi://"))?;
    let dir = state_dir.join("pools").join(pool);
    if !dir.join("meta").is_dir() {
        return Err(format!(
            "there is no pool '{pool}' in {}",
            state_dir.join("pools").display()
        ));
    }
    let engine = Arc::new(Engine::open(&dir, &|p| open_disk(p)).map_err(|e| format!("pool '{pool}': {e}"))?);
    let v = engine.vdisk(name).map_err(|e| format!("pool '{pool}': {e}"))?;
    Ok((
        Target::vdisk(&format!("vdisk:{pool}/{name}"), v),
        Local {
            _lock: lock,
            _engine: engine,
        },
    ))
}

fn workload(a: &BenchArgs) -> Result<Workload, String> {
    let mut w = match &a.profile {
        Some(p) => Workload::profile(p)?,
        None => Workload::default(),
    };
    if let Some(b) = a.block_size {
        w.block_size = u32::try_from(b).map_err(|_| format!("block size {b} is too large"))?;
    }
    if let Some(t) = a.threads {
        w.threads = t;
    }
    if let Some(o) = a.outstanding {
        w.outstanding = o;
    }
    if let Some(p) = a.write_percent {
        w.write_percent = p;
    }
    if a.sequential {
        w.random = false;
    }
    if a.random {
        w.random = true;
    }
    w.duration = Duration::from_secs_f64(a.duration);
    w.warmup = Duration::from_secs_f64(a.warmup);
    w.offset = a.offset;
    w.size = a.size;
    w.verify = a.verify;
    if let Some(through) = a.caching {
        w.write_through = through;
    }
    if !(a.duration > 0.0) || a.warmup < 0.0 {
        return Err("the duration must be positive and the warm-up not negative".into());
    }
    Ok(w)
}

/// Runs the workload on one target, repeatedly when asked.
fn bench_one(
    spec: &TargetSpec,
    w: &Workload,
    a: &BenchArgs,
    state_dir: &Path,
    rt: &tokio::runtime::Runtime,
) -> Result<Summary, String> {
    let connect = Connect {
        initiator: a.initiator.clone(),
        chap: a.chap_user.clone().zip(a.chap_secret.clone()),
        digests: a.digests,
    };
    let (target, _local) = match spec {
        TargetSpec::Vdisk { pool, name } => {
            let (t, l) = open_vdisk(state_dir, pool, name)?;
            (t, Some(l))
        }
        _ => (rt.block_on(Target::connect(spec, w.threads, &connect))?, None),
    };
    for note in &target.notes {
        eprintln!("{note}");
    }
    let region = w.region(target.size, target.block)?;
    let verifier = w
        .verify
        .then(|| Arc::new(Verifier::new(region.1 / w.block_size as u64, w.block_size as usize)));
    let runs = if a.until_rsd.is_some() {
        a.max_runs.max(2)
    } else {
        a.runs.max(1)
    };
    let tty = std::io::stderr().is_terminal() && !a.quiet;
    let mut reports = Vec::new();
    for i in 0..runs {
        let progress = |secs: f64, ops: u64| {
            if tty {
                eprint!(
                    "\r{}: run {}/{runs}  {secs:>5.1}/{:.0} s  {:>10.0} IOPS   ",
                    target.name,
                    i + 1,
                    w.duration.as_secs_f64(),
                    ops as f64 / secs.max(1e-3)
                );
                let _ = std::io::stderr().flush();
            }
        };
        let r = run(&target, w, verifier.clone(), rt.handle(), &progress);
        if tty {
            eprint!("\r{:80}\r", "");
        }
        reports.push(r?);
        if let Some(bound) = a.until_rsd {
            let s = Summary::new(&target.name, w, reports.clone(), Some(bound));
            if s.rsd_met == Some(true) && reports.len() >= a.runs.max(2) as usize {
                break;
            }
        }
    }
    let name = target.name.clone();
    rt.block_on(target.close());
    Ok(Summary::new(&name, w, reports, a.until_rsd))
}

pub fn bench(a: BenchArgs, state_dir: Option<PathBuf>, json: bool) -> Result<(), String> {
    let w = workload(&a)?;
    let mut specs = vec![TargetSpec::parse(&a.target)?];
    for c in &a.compare {
        specs.push(TargetSpec::parse(c)?);
    }
    if let Some(u) = a.until_rsd {
        if !(u > 0.0) {
            return Err("--until-rsd takes a positive percentage".into());
        }
    }
    let state_dir = state_dir.unwrap_or_else(|| PathBuf::from("/var/lib/tessera"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("tessera-bench")
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    let mut all = Vec::new();
    for spec in &specs {
        let s = bench_one(spec, &w, &a, &state_dir, &rt)?;
        if !json {
            println!("{}", human(&s));
        }
        all.push(s);
    }
    if json {
        let text = if a.compare.is_empty() {
            serde_json::to_string_pretty(&all[0])
        } else {
            serde_json::to_string_pretty(&all)
        };
        println!("{}", text.expect("serializable"));
    } else if all.len() > 1 {
        println!("{}", compare(&all));
    }
    if let Some(path) = &a.plot {
        crate::plot::svg(&all, path)?;
        if !json {
            println!("chart: {}", path.display());
        }
    }
    let corrupt: u64 = all.iter().map(Summary::corrupt).sum();
    if corrupt > 0 {
        return Err(format!(
            "verify found {corrupt} corrupt block read(s); see the report above"
        ));
    }
    Ok(())
}
