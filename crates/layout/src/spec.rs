//! What a layout is: kind, copies, columns and interleave, and the derived geometry numbers.

use serde::{Deserialize, Serialize};

pub const DEFAULT_INTERLEAVE: u64 = 256 << 10;
pub const MIN_INTERLEAVE: u64 = 4096;
/// Widest stripe we build; as Storage Spaces, more disks give more slab sets, not wider ones.
pub const MAX_COLUMNS: u32 = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum LayoutKind {
    Simple,
    Mirror,
    Parity,
    DualParity,
}

impl LayoutKind {
    pub fn parse(s: &str) -> Option<LayoutKind> {
        match s {
            "simple" => Some(LayoutKind::Simple),
            "mirror" => Some(LayoutKind::Mirror),
            "parity" => Some(LayoutKind::Parity),
            "dual-parity" => Some(LayoutKind::DualParity),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            LayoutKind::Simple => "simple",
            LayoutKind::Mirror => "mirror",
            LayoutKind::Parity => "parity",
            LayoutKind::DualParity => "dual-parity",
        }
    }
}

/// `columns` counts the disks one stripe spans for simple, parity and dual parity (parity
/// columns included, as Storage Spaces counts them); for a mirror it counts the data columns,
/// each held `copies` times, so a mirror slab set spans columns × copies disks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LayoutSpec {
    pub kind: LayoutKind,
    pub copies: u8,
    pub columns: u32,
    pub interleave: u64,
}

impl LayoutSpec {
    /// Defaults derived from the pool as Storage Spaces does: as many columns as there are
    /// disks for one slab set, capped at MAX_COLUMNS.
    pub fn with_defaults(
        kind: LayoutKind,
        copies: Option<u8>,
        columns: Option<u32>,
        interleave: Option<u64>,
        healthy_disks: usize,
    ) -> LayoutSpec {
        let copies = match kind {
            LayoutKind::Mirror => copies.unwrap_or(2),
            _ => copies.unwrap_or(1),
        };
        let n = healthy_disks as u32;
        let columns = columns.unwrap_or(match kind {
            LayoutKind::Simple => n.clamp(1, MAX_COLUMNS),
            LayoutKind::Mirror => (n / copies.max(1) as u32).clamp(1, MAX_COLUMNS),
            LayoutKind::Parity => n.clamp(3, MAX_COLUMNS),
            LayoutKind::DualParity => n.clamp(4, MAX_COLUMNS),
        });
        LayoutSpec {
            kind,
            copies,
            columns,
            interleave: interleave.unwrap_or(DEFAULT_INTERLEAVE),
        }
    }

    /// Checks the spec against itself, the slab size and the number of usable disks.
    pub fn validate(&self, slab_size: u64, healthy_disks: usize) -> Result<(), String> {
        let k = self.kind.as_str();
        match self.kind {
            LayoutKind::Mirror if !(2..=3).contains(&self.copies) => {
                return Err(format!("a mirror keeps 2 or 3 copies, not {}", self.copies))
            }
            LayoutKind::Mirror => {}
            _ if self.copies != 1 => return Err(format!("copies apply to mirrors only; a {k} layout keeps one copy")),
            _ => {}
        }
        let min_cols = match self.kind {
            LayoutKind::Simple | LayoutKind::Mirror => 1,
            LayoutKind::Parity => 3,
            LayoutKind::DualParity => 4,
        };
        if self.columns < min_cols || self.columns > MAX_COLUMNS * if self.kind == LayoutKind::Simple { 4 } else { 1 } {
            return Err(format!(
                "a {k} layout needs between {min_cols} and {} columns, not {}",
                if self.kind == LayoutKind::Simple {
                    MAX_COLUMNS * 4
                } else {
                    MAX_COLUMNS
                },
                self.columns
            ));
        }
        if !self.interleave.is_power_of_two() || self.interleave < MIN_INTERLEAVE || self.interleave > slab_size {
            return Err(format!(
                "interleave {} must be a power of two between {} and the slab size {}",
                self.interleave, MIN_INTERLEAVE, slab_size
            ));
        }
        if self.width() > healthy_disks {
            return Err(format!(
                "a {k} layout with {} column(s){} needs {} distinct healthy disks, and the pool has {}",
                self.columns,
                if self.kind == LayoutKind::Mirror {
                    format!(" and {} copies", self.copies)
                } else {
                    String::new()
                },
                self.width(),
                healthy_disks
            ));
        }
        Ok(())
    }

    /// Members of one slab set: the disks one stripe touches.
    pub fn width(&self) -> usize {
        match self.kind {
            LayoutKind::Mirror => self.columns as usize * self.copies as usize,
            _ => self.columns as usize,
        }
    }

    pub fn data_columns(&self) -> usize {
        match self.kind {
            LayoutKind::Simple | LayoutKind::Mirror => self.columns as usize,
            LayoutKind::Parity => self.columns as usize - 1,
            LayoutKind::DualParity => self.columns as usize - 2,
        }
    }

    pub fn parity_columns(&self) -> usize {
        match self.kind {
            LayoutKind::Parity => 1,
            LayoutKind::DualParity => 2,
            _ => 0,
        }
    }

    /// How many members of a slab set may be lost with the data still readable.
    pub fn tolerance(&self) -> usize {
        match self.kind {
            LayoutKind::Simple => 0,
            LayoutKind::Mirror => self.copies as usize - 1,
            LayoutKind::Parity => 1,
            LayoutKind::DualParity => 2,
        }
    }

    /// Logical bytes a slab set holds.
    pub fn set_capacity(&self, slab_size: u64) -> u64 {
        slab_size * self.data_columns() as u64
    }

    pub fn row_bytes(&self) -> u64 {
        self.interleave * self.data_columns() as u64
    }

    pub fn describe(&self) -> String {
        // Interleaves are powers of two from 4 KiB: KiB or MiB say them exactly.
        let il = match self.interleave {
            i if i >= 1 << 20 && i % (1 << 20) == 0 => format!("{} MiB", i >> 20),
            i if i % 1024 == 0 => format!("{} KiB", i >> 10),
            i => format!("{i} B"),
        };
        match self.kind {
            LayoutKind::Mirror => format!(
                "{}-way mirror, {} column(s), interleave {il}",
                self.copies, self.columns
            ),
            _ => format!("{}, {} column(s), interleave {il}", self.kind.as_str(), self.columns),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_the_pool() {
        let s = LayoutSpec::with_defaults(LayoutKind::Mirror, None, None, None, 4);
        assert_eq!((s.copies, s.columns, s.width()), (2, 2, 4));
        let s = LayoutSpec::with_defaults(LayoutKind::Mirror, Some(3), None, None, 4);
        assert_eq!((s.columns, s.width()), (1, 3));
        let s = LayoutSpec::with_defaults(LayoutKind::Parity, None, None, None, 12);
        assert_eq!((s.columns, s.data_columns()), (8, 7));
        let s = LayoutSpec::with_defaults(LayoutKind::DualParity, None, None, None, 5);
        assert_eq!((s.columns, s.data_columns(), s.tolerance()), (5, 3, 2));
    }

    #[test]
    fn impossible_layouts_are_refused() {
        let ss = 1 << 20;
        let m3 = LayoutSpec {
            kind: LayoutKind::Mirror,
            copies: 3,
            columns: 1,
            interleave: 65536,
        };
        let e = m3.validate(ss, 2).unwrap_err();
        assert!(e.contains("needs 3 distinct healthy disks"), "{e}");
        assert!(m3.validate(ss, 3).is_ok());
        let p2 = LayoutSpec {
            kind: LayoutKind::Parity,
            copies: 1,
            columns: 2,
            interleave: 65536,
        };
        assert!(p2.validate(ss, 8).unwrap_err().contains("between 3 and"));
        let d3 = LayoutSpec {
            kind: LayoutKind::DualParity,
            copies: 1,
            columns: 3,
            interleave: 65536,
        };
        assert!(d3.validate(ss, 8).is_err());
        let m4 = LayoutSpec {
            kind: LayoutKind::Mirror,
            copies: 4,
            columns: 1,
            interleave: 65536,
        };
        assert!(m4.validate(ss, 8).is_err());
        let odd = LayoutSpec {
            kind: LayoutKind::Simple,
            copies: 1,
            columns: 1,
            interleave: 12288,
        };
        assert!(odd.validate(ss, 8).is_err());
        let big = LayoutSpec {
            kind: LayoutKind::Simple,
            copies: 1,
            columns: 1,
            interleave: 2 << 20,
        };
        assert!(big.validate(ss, 8).is_err());
    }
}
