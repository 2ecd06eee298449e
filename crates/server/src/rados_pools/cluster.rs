//! Connecting to a pool's Ceph cluster, and reading what it holds of a pool without owning it:
//! its records and its label, checked before a taking.

use std::sync::Arc;

use tessera_ownership::fence::{epoch_of, EPOCH_ATTR};
use tessera_ownership::rados_meta::{version_of, RadosMeta, VERSION_ATTR};
use tessera_pool::{MetaStore, Pool};
use tessera_rados::Cluster;

use super::*;
use crate::data_paths::{through, DataUse};

/// Whether the metadata object of pool `name` is in `pool`: one a first batch made
/// carries its version.
pub(super) fn metadata_is_there(pool: &tessera_rados::Pool<'_>, name: &str) -> Result<bool, String> {
    let version = pool
        .xattr(&Placement::meta_object(name), VERSION_ATTR)
        .map_err(|e| format!("cannot read the metadata of pool {name}: {e}"))?;
    Ok(version.is_some())
}

/// Fails, saying why, if the opening of pool `name` would refuse its records or its
/// label as the cluster holds them (its configuration record missing or unreadable, or
/// naming no disk where `placement` says; its label wiped, or another pool's), or cannot
/// read them now (a timeout). Checked before a
/// taking, which fences the previous owner's connection off (a blocklist entry that
/// lasts 30 days, and a new map for every OSD and client): a damaged pool tried again
/// every 30 s would otherwise add thousands of entries a day, each for an opening that
/// fails.
///
/// Ok: the epoch the pool's metadata was last stamped at (at an opening), if any, for the
/// taker to check against etcd's revision.
pub(super) fn openable_records(
    cluster: &Arc<Cluster>,
    name: &str,
    placement: &Placement,
) -> Result<Option<i64>, String> {
    let pool = records_pool(cluster, placement)?;
    let not_taken = "it is not taken until that is put right (each taking would fence a connection off for nothing)";
    let stamped = stamped_epoch(&pool, placement, name).map_err(|e| format!("{e}; {not_taken}"))?;
    // An opening refuses a disk without the pool's label too: wiped by a destruction
    // that has not removed the records yet, say. Read here, through the handle the
    // records are then read through, and judged after them.
    let label = label_in(&pool, placement, name);
    // Read only: the epoch is never written.
    let records = MetaStore::on(RadosMeta::new(pool, &Placement::meta_object(name), 0));
    let config = Pool::recorded_config(&records)
        .map_err(|e| format!("the records of pool {name} cannot be read: {e}; {not_taken}"))?;
    let path = placement.disk_path(name);
    if !config.disks.iter().any(|d| d.path == path) {
        return Err(format!(
            "the records of pool {name} name no disk {path} (they name {}): they are another pool's, or damaged; {not_taken}",
            config.disks.iter().map(|d| d.path.as_str()).collect::<Vec<_>>().join(", ")
        ));
    }
    match label.map_err(|e| format!("{e}; {not_taken}"))? {
        Ok(l) if l.pool_id == config.id => Ok(stamped),
        Ok(l) => Err(format!(
            "the disk of pool {name} carries the label of another pool, '{}' ({}); {not_taken}",
            l.pool_name, l.pool_id
        )),
        Err(tessera_disk::LabelError::Missing { .. }) => Err(format!(
            "the label of pool {name} is gone: the pool was destroyed, or is being destroyed, at a gateway \
             (which wipes the label before it removes the rest); {not_taken} ('tessera pool export {name}' \
             forgets it here)"
        )),
        Err(e) => Err(format!("the label of pool {name} cannot be read ({e}); {not_taken}")),
    }
}

/// The epoch the metadata object of pool `name` was last stamped at, if it was; Err if its
/// version or its epoch is not as a commit writes them (set by hand, damaged): every commit
/// of an opening would then be refused (a version unreadable or at its largest; an epoch
/// that sorts after any a taking gets), after its taking fenced a connection off.
fn stamped_epoch(pool: &tessera_rados::Pool<'_>, placement: &Placement, name: &str) -> Result<Option<i64>, String> {
    let oid = Placement::meta_object(name);
    let attr = |attr: &str| {
        pool.xattr(&oid, attr)
            .map_err(|e| format!("cannot read {attr} of pool {name}'s metadata: {e}"))
    };
    // As this gateway reaches the cluster, not as the machine's defaults would.
    let rados = format!(
        "rados -c {} --id {} -p {}",
        placement.ceph_conf, placement.client_name, placement.rados_pool
    );
    if let Some(v) = attr(VERSION_ATTR)? {
        // Commits are guarded by the bytes they read, never by the number: any below the
        // largest will do.
        if version_of(&v).is_none_or(|v| v == u64::MAX) {
            return Err(format!(
                "the metadata of pool {name} holds {VERSION_ATTR} {:?}, which no commit can follow: once no \
                 gateway serves the pool, set it to a number ('{rados} setxattr {oid} {VERSION_ATTR} 1')",
                String::from_utf8_lossy(&v)
            ));
        }
    }
    match attr(EPOCH_ATTR)? {
        None => Ok(None),
        // The data objects carry the real epochs as their writes' sequence: the next taking's
        // (a later one) stamps the attribute again.
        Some(t) => epoch_of(&t).map(Some).ok_or_else(|| {
            format!(
                "the metadata of pool {name} holds {EPOCH_ATTR} {:?}, not an epoch: once no gateway serves the \
                 pool, remove it ('{rados} rmxattr {oid} {EPOCH_ATTR}') for the next opening to stamp it again",
                String::from_utf8_lossy(&t)
            )
        }),
    }
}

/// The RADOS pool that `placement` puts pools in, through `cluster`.
pub(super) fn records_pool(
    cluster: &Arc<Cluster>,
    placement: &Placement,
) -> Result<tessera_rados::Pool<'static>, String> {
    Cluster::shared_pool(cluster, &placement.rados_pool).map_err(|e| e.to_string())
}

/// The label of pool `name` as `pool` holds it (that of its disk), read without owning
/// the pool: nothing is written. Err: the cluster did not answer.
pub(super) fn label_in(
    pool: &tessera_rados::Pool<'_>,
    placement: &Placement,
    name: &str,
) -> Result<Result<tessera_disk::Label, tessera_disk::LabelError>, String> {
    let oid = tessera_ownership::fenced_disk::object_name(&Placement::data_prefix(name), 0);
    let mut block = vec![0u8; tessera_disk::LABEL_SIZE];
    match pool.read(&oid, 0, &mut block) {
        // Read as the disk reads it: what an object does not hold is zeros.
        Ok(_) => {}
        Err(e) if e.errno() == Some(libc::ENOENT) => {}
        Err(e) => return Err(format!("cannot read the label of pool {name}: {e}")),
    }
    Ok(tessera_disk::Label::decode(&placement.disk_path(name), &block))
}

/// Seconds a call to the cluster may take before it fails instead of hanging (an OSD or
/// monitor gone away).
pub(super) const CLUSTER_TIMEOUT: &str = "30";

/// A connection to a pool's cluster made when first needed, and only once.
#[derive(Default)]
pub(super) struct Link(Option<Arc<Cluster>>);

impl Link {
    pub(super) fn cluster(&mut self, placement: &Placement, paths: &DataPaths) -> Result<Arc<Cluster>, String> {
        if let Some(c) = &self.0 {
            return Ok(c.clone());
        }
        let c = connect(placement, paths)?;
        self.0 = Some(c.clone());
        Ok(c)
    }
}

/// Connects to the cluster of `placement`. A configuration file other than the system's
/// was named through the API: it is read through the file `paths` found and checked (no
/// link swapped in between leads elsewhere), at every connection, so that a change of
/// `data_paths` counts for pools made before it, and the files it names are vetted
/// ([`DataPaths::vet_ceph_options`]) and kept so, whatever its monitors say.
pub(super) fn connect(placement: &Placement, paths: &DataPaths) -> Result<Arc<Cluster>, String> {
    let named = placement.ceph_conf != DEFAULT_CEPH_CONF;
    let found = match named {
        true => Some(paths.locate(Path::new(&placement.ceph_conf), DataUse::CephConf)?),
        false => None,
    };
    let conf = match &found {
        Some(f) => through(f).display().to_string(),
        None => placement.ceph_conf.clone(),
    };
    // The connection too: Ceph's default has it wait 300 s for monitors that do not
    // answer, and it is made in the tick, which would keep every other pool waiting.
    //
    // And room for every operation a pool's disk may have in flight: librados makes a
    // submission wait once 1,024 operations or 100 MiB are in flight, and a disk submits
    // its writes (up to 24 MiB of them, 49,152 of 512 bytes) holding the lock its other
    // writes, its reads' completions and the tick's look at its refusals wait for. What
    // a disk holds in memory is bounded by its own limit and the hosts' queues. (A
    // connection serves one opening of one pool, whose data is on one disk.)
    let options = [
        ("rados_osd_op_timeout", CLUSTER_TIMEOUT),
        ("rados_mon_op_timeout", CLUSTER_TIMEOUT),
        ("client_mount_timeout", CLUSTER_TIMEOUT),
        ("objecter_inflight_ops", "65536"),
        ("objecter_inflight_op_bytes", "536870912"),
    ];
    let client = &placement.client_name;
    match named {
        true => Cluster::connect_vetted(&conf, client, &options, |changed| {
            let mut vetted = tessera_rados::Vetted::default();
            for pin in paths.vet_ceph_options(&placement.ceph_conf, changed)? {
                vetted.instead.push((pin.option.clone(), pin.value()));
                vetted.keep.extend(pin.file);
            }
            Ok(vetted)
        }),
        false => Cluster::connect(&conf, client, &options),
    }
    .map_err(|e| {
        format!(
            "cannot connect to the Ceph cluster of {} as client.{}: {e}",
            placement.ceph_conf, placement.client_name
        )
    })
    .map(Arc::new)
}

/// The label on `disk`, pool `name`'s; Err if the cluster did not answer.
pub(super) fn label_of(
    name: &str,
    disk: &dyn tessera_disk::BlockDevice,
) -> Result<Result<tessera_disk::Label, tessera_disk::LabelError>, String> {
    match tessera_disk::read_label(disk) {
        Err(tessera_disk::LabelError::Disk(e)) => Err(format!("cannot read the label of pool {name}: {e}")),
        found => Ok(found),
    }
}
