//! Where the log holds each range of a slab set: per set, non-overlapping pieces keyed by
//! their offset in the set. A newer write cuts what it covers out of older pieces; a piece
//! stays after it is destaged (clean) until the log space of its batch is reused, so that a
//! write that bypasses the cache can tell that the log still holds an older copy of the range
//! that a replay would bring back.

use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    pub len: u64,
    /// The batch that holds it.
    pub seq: u64,
    /// Log position of its first byte.
    pub log: u64,
    /// Not yet written to the layout.
    pub dirty: bool,
    pub vdisk: u64,
}

impl Piece {
    /// The part `[from, from + len)` of this piece, which starts at `start`.
    fn part(&self, start: u64, from: u64, len: u64) -> Piece {
        Piece {
            len,
            log: self.log + (from - start),
            ..*self
        }
    }
}

#[derive(Default, Debug)]
pub struct SetIndex {
    map: BTreeMap<u64, Piece>,
}

impl SetIndex {
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Removes `[a, b)`, splitting the pieces at its edges; returns what it removed.
    pub fn cut(&mut self, a: u64, b: u64) -> Vec<(u64, Piece)> {
        let mut removed = Vec::new();
        if let Some((&s, &p)) = self.map.range(..a).next_back() {
            if s + p.len > a {
                self.map.insert(s, p.part(s, s, a - s));
                let end = (s + p.len).min(b);
                removed.push((a, p.part(s, a, end - a)));
                if s + p.len > b {
                    self.map.insert(b, p.part(s, b, s + p.len - b));
                }
            }
        }
        let inside: Vec<u64> = self.map.range(a..b).map(|(&s, _)| s).collect();
        for s in inside {
            let p = self.map.remove(&s).expect("listed");
            let end = s + p.len;
            removed.push((s, p.part(s, s, end.min(b) - s)));
            if end > b {
                self.map.insert(b, p.part(s, b, end - b));
            }
        }
        removed
    }

    /// Puts `p` at `a`, cutting out whatever it covers; returns what it replaced.
    pub fn insert(&mut self, a: u64, p: Piece) -> Vec<(u64, Piece)> {
        let removed = self.cut(a, a + p.len);
        self.map.insert(a, p);
        removed
    }

    /// The pieces that overlap `[a, b)`, trimmed to it.
    pub fn overlapping(&self, a: u64, b: u64) -> Vec<(u64, Piece)> {
        let mut out = Vec::new();
        if let Some((&s, p)) = self.map.range(..a).next_back() {
            if s + p.len > a {
                out.push((a, p.part(s, a, (s + p.len).min(b) - a)));
            }
        }
        for (&s, p) in self.map.range(a..b) {
            out.push((s, p.part(s, s, (s + p.len).min(b) - s)));
        }
        out
    }

    /// Marks clean the parts of `[a, b)` that batch `seq` still holds dirty; returns them.
    pub fn mark_clean(&mut self, a: u64, b: u64, seq: u64) -> Vec<(u64, Piece)> {
        let hit: Vec<(u64, Piece)> = self
            .overlapping(a, b)
            .into_iter()
            .filter(|(_, p)| p.seq == seq && p.dirty)
            .collect();
        for (s, p) in &hit {
            self.cut(*s, s + p.len);
            self.map.insert(*s, Piece { dirty: false, ..*p });
        }
        hit
    }

    /// Removes the parts of `[a, b)` that batch `seq` holds; returns them.
    pub fn remove_batch(&mut self, a: u64, b: u64, seq: u64) -> Vec<(u64, Piece)> {
        let hit: Vec<(u64, Piece)> = self
            .overlapping(a, b)
            .into_iter()
            .filter(|(_, p)| p.seq == seq)
            .collect();
        for (s, p) in &hit {
            self.cut(*s, s + p.len);
        }
        hit
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    fn piece(len: u64, seq: u64, log: u64) -> Piece {
        Piece {
            len,
            seq,
            log,
            dirty: true,
            vdisk: 1,
        }
    }

    /// Every covered byte against a per-byte model of (seq, log position, dirty).
    fn flat(ix: &SetIndex) -> HashMap<u64, (u64, u64, bool)> {
        let mut m = HashMap::new();
        let mut last_end = 0;
        for (&s, p) in &ix.map {
            assert!(s >= last_end, "pieces overlap at {s}");
            assert!(p.len > 0, "empty piece at {s}");
            last_end = s + p.len;
            for i in 0..p.len {
                m.insert(s + i, (p.seq, p.log + i, p.dirty));
            }
        }
        m
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64, u64),
        Clean(u64, u64, u64),
        Remove(u64, u64, u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..60u64, 1..20u64).prop_map(|(a, l)| Op::Insert(a, l)),
            (0..60u64, 1..30u64, 0..12u64).prop_map(|(a, l, s)| Op::Clean(a, l, s)),
            (0..60u64, 1..30u64, 0..12u64).prop_map(|(a, l, s)| Op::Remove(a, l, s)),
        ]
    }

    proptest! {
        #[test]
        fn the_index_matches_a_byte_model(ops in proptest::collection::vec(op(), 1..40)) {
            let mut ix = SetIndex::default();
            let mut model: HashMap<u64, (u64, u64, bool)> = HashMap::new();
            for (seq, op) in ops.into_iter().enumerate() {
                let seq = seq as u64 % 12;
                match op {
                    Op::Insert(a, l) => {
                        let log = 1000 * seq;
                        ix.insert(a, piece(l, seq, log));
                        for i in 0..l {
                            model.insert(a + i, (seq, log + i, true));
                        }
                    }
                    Op::Clean(a, l, s) => {
                        let hit: u64 = ix.mark_clean(a, a + l, s).iter().map(|(_, p)| p.len).sum();
                        let mut want = 0;
                        for i in a..a + l {
                            if let Some(v) = model.get_mut(&i) {
                                if v.0 == s && v.2 {
                                    v.2 = false;
                                    want += 1;
                                }
                            }
                        }
                        prop_assert_eq!(hit, want);
                    }
                    Op::Remove(a, l, s) => {
                        ix.remove_batch(a, a + l, s);
                        for i in a..a + l {
                            if model.get(&i).map(|v| v.0) == Some(s) {
                                model.remove(&i);
                            }
                        }
                    }
                }
                prop_assert_eq!(flat(&ix), model.clone());
            }
        }
    }

    #[test]
    fn an_overwrite_in_the_middle_splits_the_old_piece() {
        let mut ix = SetIndex::default();
        ix.insert(0, piece(100, 1, 0));
        let gone = ix.insert(40, piece(10, 2, 500));
        assert_eq!(gone, vec![(40, piece(10, 1, 40))]);
        let all = ix.overlapping(0, 100);
        assert_eq!(
            all,
            vec![(0, piece(40, 1, 0)), (40, piece(10, 2, 500)), (50, piece(50, 1, 50))]
        );
    }
}
