//! clone_range: make a destination range share the source's grains, copy-on-write on both
//! sides afterwards. Snapshots, clones, ODX and XCOPY all come down to this.

use tessera_disk::AlignedBuf;
use tessera_pool::{refcount_delta, CF_GRAINS, CF_REFCOUNTS};

use crate::commit::Op;
use crate::config::{Provisioning, VdiskSpec};
use crate::engine::Engine;
use crate::error::{Result, VolumeError};
use crate::keys::{grain_key, loc_value, refcount_key};
use crate::vdisk::{Vdisk, BATCH_GRAINS};

/// How a clone_range was carried out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CloneStats {
    /// Bytes that now share the source's grains.
    pub shared_bytes: u64,
    /// Bytes copied (grain edges, or vdisks whose grains cannot be shared).
    pub copied_bytes: u64,
}

const COPY_CHUNK: u64 = 1 << 20;

impl Engine {
    /// A new thin vdisk `name` with the layout, grain and block size of `src`, reading as `src`
    /// does: every grain shared, nothing copied but a partial last grain. The clone and its
    /// source are copy-on-write from then on, and either can be deleted first. Each grain is
    /// copied consistently, but writes racing the clone may land in it for some grains and
    /// not others: clone a vdisk nobody is writing, or a snapshot.
    pub fn clone_vdisk(&self, src: &str, name: &str) -> Result<(std::sync::Arc<Vdisk>, CloneStats)> {
        let s = self.vdisk(src)?;
        let c = s.config();
        let mut spec = VdiskSpec::new(name, c.size, c.layout.kind);
        spec.copies = Some(c.layout.copies);
        spec.columns = Some(c.layout.columns);
        spec.interleave = Some(c.layout.interleave);
        spec.grain_size = Some(c.grain_size);
        spec.block_size = Some(c.block_size);
        spec.provisioning = Provisioning::Thin;
        let v = self.create_vdisk(&spec)?;
        match self.clone_range(&s, 0, &v, 0, c.size) {
            Ok(stats) => Ok((v, stats)),
            Err(e) => {
                if let Err(d) = self.delete_vdisk(name) {
                    tracing::warn!(vdisk = name, error = %d, "cannot remove the half-made clone");
                }
                Err(e)
            }
        }
    }

    /// Makes [dst_off, dst_off + len) of `dst` read as [src_off, src_off + len) of `src` did.
    /// Whole grains are shared when both vdisks have the same layout and grain size and the
    /// offsets line up within a grain; the rest is copied inside the server. Overlapping
    /// ranges of one vdisk behave as a memmove.
    pub fn clone_range(&self, src: &Vdisk, src_off: u64, dst: &Vdisk, dst_off: u64, len: u64) -> Result<CloneStats> {
        src.check_range(src_off, len)?;
        dst.check_range(dst_off, len)?;
        if !std::ptr::eq(src.s.as_ref(), self.shared().as_ref())
            || !std::ptr::eq(dst.s.as_ref(), self.shared().as_ref())
        {
            return Err(VolumeError::Invalid(
                "clone_range between vdisks of different pools".into(),
            ));
        }
        let same = src.id == dst.id;
        if same && src_off == dst_off {
            return Ok(CloneStats::default());
        }
        let g = src.class.grain;
        let shareable = src.class == dst.class && src_off % g == dst_off % g;
        // Copy back to front when the destination overlaps the source from above.
        let backwards = same && dst_off > src_off && dst_off < src_off + len;
        let mut stats = CloneStats::default();
        let mut segments: Vec<(u64, u64, bool)> = Vec::new(); // (offset from start, length, share)
        if shareable {
            let head = ((g - src_off % g) % g).min(len);
            let body = (len - head) / g * g;
            let tail = len - head - body;
            if head > 0 {
                segments.push((0, head, false));
            }
            if body > 0 {
                segments.push((head, body, true));
            }
            if tail > 0 {
                segments.push((head + body, tail, false));
            }
        } else {
            segments.push((0, len, false));
        }
        if backwards {
            segments.reverse();
        }
        for (rel, n, share) in segments {
            if share {
                self.share_grains(src, (src_off + rel) / g, dst, (dst_off + rel) / g, n / g, backwards)?;
                stats.shared_bytes += n;
            } else {
                self.copy_bytes(src, src_off + rel, dst, dst_off + rel, n, backwards)?;
                stats.copied_bytes += n;
            }
        }
        self.shared().space.reclaim_empty()?;
        Ok(stats)
    }

    fn copy_bytes(&self, src: &Vdisk, so: u64, dst: &Vdisk, d_o: u64, len: u64, backwards: bool) -> Result<()> {
        let mut chunks = Vec::new();
        let mut at = 0;
        while at < len {
            let n = COPY_CHUNK.min(len - at);
            chunks.push((at, n));
            at += n;
        }
        if backwards {
            chunks.reverse();
        }
        let mut buf = AlignedBuf::zeroed(COPY_CHUNK as usize);
        for (at, n) in chunks {
            let b = &mut buf[..n as usize];
            src.read(so + at, b)?;
            dst.write(d_o + at, b, false)?;
        }
        Ok(())
    }

    fn share_grains(&self, src: &Vdisk, sg: u64, dst: &Vdisk, dg: u64, count: u64, backwards: bool) -> Result<()> {
        let s = self.shared();
        let mut starts: Vec<u64> = (0..count).step_by(BATCH_GRAINS as usize).collect();
        if backwards {
            starts.reverse();
        }
        for k0 in starts {
            let n = BATCH_GRAINS.min(count - k0);
            let _locks = s
                .locks
                .lock_many((0..n).flat_map(|k| [(src.id, sg + k0 + k), (dst.id, dg + k0 + k)]));
            let mut ops = Vec::new();
            let mut changes = Vec::new(); // (dst grain, new loc, old loc)
            let order: Vec<u64> = if backwards {
                (0..n).rev().collect()
            } else {
                (0..n).collect()
            };
            for k in order {
                let (sgi, dgi) = (sg + k0 + k, dg + k0 + k);
                // Iterating away from the overlap (see `backwards`), no source grain read here
                // was changed earlier in this batch, so the maps can be read as they are.
                let new = src.entry(sgi);
                let old = dst.entry(dgi);
                if new == old {
                    continue;
                }
                if new != 0 {
                    ops.push(Op::Put(CF_GRAINS, grain_key(dst.id, dgi), loc_value(new)));
                    ops.push(Op::Merge(CF_REFCOUNTS, refcount_key(new), refcount_delta(1).to_vec()));
                } else {
                    ops.push(Op::Delete(CF_GRAINS, grain_key(dst.id, dgi)));
                }
                if old != 0 {
                    ops.push(Op::Merge(CF_REFCOUNTS, refcount_key(old), refcount_delta(-1).to_vec()));
                }
                changes.push((dgi, new, old));
            }
            // References are counted before the batch commits, and uncounted after.
            for &(_, new, _) in &changes {
                if new != 0 {
                    s.space.incref(new);
                }
            }
            if let Err(e) = s.committer.commit(ops) {
                for &(_, new, _) in &changes {
                    if new != 0 {
                        s.space.decref(new);
                    }
                }
                return Err(e);
            }
            let (mut gained, mut lost) = (0u64, 0u64);
            for &(dgi, new, old) in &changes {
                dst.set_entry(dgi, new);
                if old != 0 {
                    s.space.decref(old);
                }
                match (old != 0, new != 0) {
                    (false, true) => gained += 1,
                    (true, false) => lost += 1,
                    _ => {}
                }
            }
            if dst.fixed() {
                // A fixed vdisk keeps space reserved for exactly its unmapped grains.
                s.space.unreserve(dst.class, gained);
                if lost > 0 {
                    if let Err(e) = s.space.reserve(dst.class, lost) {
                        tracing::warn!(vdisk = %dst.name(), error = %e, "cannot keep the reservation of unmapped grains");
                    }
                }
            }
        }
        Ok(())
    }
}
