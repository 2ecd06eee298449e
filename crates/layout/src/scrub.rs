//! Scrub: reads every row of a slab set and checks that its redundancy agrees with its data
//! (mirror copies equal, parity equal to the parity of the data). It reports; it does not
//! repair. The online scan job builds on it.

use tessera_pool::SlabRef;

use crate::codec;
use crate::error::Result;
use crate::geometry::{data_members, parity_members};
use crate::layouts::Layouts;
use crate::slabset::SlabSet;
use crate::spec::LayoutKind;

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Mismatch {
    pub set: u32,
    pub row: u64,
    pub what: String,
}

impl Layouts {
    /// Checks every row of a slab set. Rows with an unavailable member are skipped (there is
    /// nothing to compare with); each row is checked under its lock, so concurrent writes do
    /// not show up as false mismatches.
    pub fn scrub_set(&self, set: &SlabSet) -> Result<Vec<Mismatch>> {
        let spec = set.spec;
        if spec.kind == LayoutKind::Simple {
            return Ok(Vec::new());
        }
        let members = set.members.read();
        if self.unavailable(&members) > 0 {
            return Ok(Vec::new());
        }
        let il = spec.interleave as usize;
        let rows = self.pool.slab_size() / spec.interleave;
        let mut out = Vec::new();
        for row in 0..rows {
            let _g = self.row_lock(set.id, row).write();
            let mo = row * spec.interleave;
            let read = |m: usize| -> Option<Vec<u8>> {
                let mut b = tessera_disk::AlignedBuf::zeroed(il);
                self.member_read(members[m], mo, &mut b).ok().map(|_| b.to_vec())
            };
            if let Some(w) = self.scrub_row(&spec, &members, row, &read) {
                out.push(Mismatch {
                    set: set.id,
                    row,
                    what: w,
                });
            }
        }
        Ok(out)
    }

    fn scrub_row(
        &self,
        spec: &crate::spec::LayoutSpec,
        _members: &[SlabRef],
        row: u64,
        read: &dyn Fn(usize) -> Option<Vec<u8>>,
    ) -> Option<String> {
        let mut data = Vec::new();
        for d in 0..spec.data_columns() {
            let copies = data_members(spec, row, d);
            let first = read(copies[0])?;
            for &c in &copies[1..] {
                if read(c)? != first {
                    return Some(format!("copies of column {d} differ"));
                }
            }
            data.push(first);
        }
        if spec.parity_columns() > 0 {
            let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
            let want = codec::encode(spec.parity_columns(), &refs).ok()?;
            for (i, pm) in parity_members(spec, row).into_iter().enumerate() {
                if read(pm)? != want[i] {
                    return Some(format!("parity {i} does not match the data"));
                }
            }
        }
        None
    }
}
