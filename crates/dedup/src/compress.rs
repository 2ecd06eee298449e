//! The stored form of a compressed grain: a six-byte header (a magic byte, the codec, the
//! compressed length) and the compressed bytes, padded by the caller to its packing unit. A
//! grain is stored compressed only where that saves enough: the rest stay as they are, and
//! are read with no decompression.
//!
//! `balanced` by default: each grain in lz4 unless lz4's form is over half the grain and
//! zstd's (level 1) a sixteenth of the grain shorter. On the OS images of `bench/dedup.sh` it
//! saves 90.3 % of the set where zstd alone saves 91.1 % and lz4 88.1 %, keeps about half
//! the grains in lz4, which decompresses about seven times faster than zstd (1.3 against 9 µs
//! a grain there), and compresses 58 % of the grains twice, which lz4's speed on the rest
//! about pays for. `zstd` is for pools whose space matters more than their reads, `lz4` for
//! the other way round.

use std::cell::RefCell;

use serde::{Deserialize, Serialize};

/// How a pool's deduplicated data is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema, Default)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    Off,
    Lz4,
    Zstd,
    /// lz4, or zstd where lz4's form is over half the grain and zstd's a sixteenth of the
    /// grain shorter.
    #[default]
    Balanced,
}

const MAGIC: u8 = 0xc7;
const HEADER: usize = 6;
const ZSTD_LEVEL: i32 = 1;

/// A codec a form is made with; its value is the byte of the form's header that names it.
#[derive(Debug, Clone, Copy)]
#[repr(u8)]
enum Codec {
    Zstd = 1,
    Lz4 = 2,
}

const CODEC_ZSTD: u8 = Codec::Zstd as u8;
const CODEC_LZ4: u8 = Codec::Lz4 as u8;

/// `Balanced` tries zstd only where lz4's form is longer than this share of the grain
/// (1/2: 2 KiB of 4): where lz4 saves more than half, zstd's few hundred bytes more are not
/// worth compressing the grain twice, nor its slower reads.
const BALANCED_TRY_OVER: usize = 2;
/// ...and keeps zstd's form only where it is shorter than lz4's by this share of the grain
/// (1/16: 256 bytes of 4 KiB), which is what the slower read buys.
const BALANCED_GAIN: usize = 16;

thread_local! {
    static ZSTD_C: RefCell<Option<zstd::bulk::Compressor<'static>>> = const { RefCell::new(None) };
    static ZSTD_D: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
}

impl Compression {
    pub fn parse(s: &str) -> Option<Compression> {
        match s {
            "off" | "none" => Some(Compression::Off),
            "lz4" => Some(Compression::Lz4),
            "zstd" => Some(Compression::Zstd),
            "balanced" => Some(Compression::Balanced),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Compression::Off => "off",
            Compression::Lz4 => "lz4",
            Compression::Zstd => "zstd",
            Compression::Balanced => "balanced",
        }
    }

    /// The stored form of `grain` when it takes `limit` bytes at most; `None` when
    /// compression is off or the form would be longer.
    pub fn compress(self, grain: &[u8], limit: usize) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        self.compress_into(grain, limit, &mut out).map(|_| out)
    }

    /// Appends the stored form of `grain` to `out` when it takes `limit` bytes at most, and
    /// gives its length; `None`, with `out` as it was, when compression is off or the form
    /// would be longer. Forms written end to end in one buffer cost no allocation each, and
    /// nothing is zeroed first.
    pub fn compress_into(self, grain: &[u8], limit: usize, out: &mut Vec<u8>) -> Option<usize> {
        match self {
            Compression::Off => None,
            Compression::Zstd => form_into(Codec::Zstd, grain, limit, out),
            Compression::Lz4 => form_into(Codec::Lz4, grain, limit, out),
            Compression::Balanced => {
                let start = out.len();
                let lz4_len = form_into(Codec::Lz4, grain, limit, out);
                if lz4_len.is_some_and(|n| n <= grain.len() / BALANCED_TRY_OVER) {
                    return lz4_len;
                }
                let zstd_limit = match lz4_len {
                    Some(n) => n.saturating_sub(grain.len() / BALANCED_GAIN),
                    None => limit,
                };
                // zstd's form goes after lz4's, and takes its place if it is kept.
                let after = out.len();
                match form_into(Codec::Zstd, grain, zstd_limit, out) {
                    Some(n) => {
                        out.copy_within(after..after + n, start);
                        out.truncate(start + n);
                        Some(n)
                    }
                    None => lz4_len,
                }
            }
        }
    }
}

/// Appends the stored form of `grain` in `codec` to `out` when it takes `limit` bytes at
/// most, and gives its length; leaves `out` as it was when not.
fn form_into(codec: Codec, grain: &[u8], limit: usize, out: &mut Vec<u8>) -> Option<usize> {
    if limit <= HEADER {
        return None;
    }
    let start = out.len();
    out.extend_from_slice(&[MAGIC, codec as u8, 0, 0, 0, 0]);
    let n = match codec {
        Codec::Zstd => zstd_into(grain, out),
        Codec::Lz4 => lz4_into(grain, limit - HEADER, out),
    };
    match n {
        Some(n) if HEADER + n <= limit => {
            out[start + 2..start + HEADER].copy_from_slice(&(n as u32).to_le_bytes());
            Some(HEADER + n)
        }
        _ => {
            out.truncate(start);
            None
        }
    }
}

/// zstd's form of `grain` appended to `out` (it may be longer than the caller allows, which
/// the caller checks). zstd is given room for any form, so that a form is kept exactly when
/// it fits the caller's limit, whatever room `out` had past its end (with less, it may fail
/// on a form that would have fitted); lz4, below, is told the room and gives up as soon as
/// the form outgrows it.
fn zstd_into(grain: &[u8], out: &mut Vec<u8>) -> Option<usize> {
    out.reserve(zstd::zstd_safe::compress_bound(grain.len()));
    ZSTD_C.with(|c| {
        let mut c = c.borrow_mut();
        if c.is_none() {
            *c = zstd::bulk::Compressor::new(ZSTD_LEVEL).ok();
        }
        let at = out.len() as u64;
        let mut tail = std::io::Cursor::new(&mut *out);
        tail.set_position(at);
        c.as_mut()?.compress_to_buffer(grain, &mut tail).ok()
    })
}

/// lz4's block form of `grain` appended to `out`, if it fits in `room` bytes. The C reference
/// encoder (which RocksDB's build compiles anyway): on the file server's grains of
/// `bench/dedup.sh` it takes 6.9 µs a grain where lz4_flex took 8.4, and it writes only into
/// the room it is given. Its forms are the same block format as lz4_flex's.
fn lz4_into(grain: &[u8], room: usize, out: &mut Vec<u8>) -> Option<usize> {
    let len = i32::try_from(grain.len()).ok()?;
    let room_c = i32::try_from(room).ok()?;
    out.reserve(room);
    let at = out.len();
    // SAFETY: LZ4_compress_default reads `len` bytes from `grain` and writes at most `room`
    // bytes from `out`'s end, both valid for that long (reserved above); it returns 0 when the
    // form does not fit. The bytes it wrote are initialized before the length covers them.
    let n = unsafe {
        let n = lz4_sys::LZ4_compress_default(grain.as_ptr().cast(), out.as_mut_ptr().add(at).cast(), len, room_c);
        if n > 0 {
            out.set_len(at + n as usize);
        }
        n
    };
    usize::try_from(n).ok().filter(|&n| n > 0)
}

/// Decompresses a stored form (with any padding after it) into `out`, which must come out
/// exactly full: a header that is not ours, a length past the end, or a codec that fails or
/// gives another length is an error, never data.
pub fn decompress(stored: &[u8], out: &mut [u8]) -> Result<(), String> {
    if stored.len() < HEADER || stored[0] != MAGIC {
        return Err("not a compressed grain (bad header)".into());
    }
    let n = u32::from_le_bytes(stored[2..HEADER].try_into().expect("4 bytes")) as usize;
    let body = stored
        .get(HEADER..HEADER + n)
        .ok_or_else(|| format!("compressed length {n} goes past the piece ({} bytes)", stored.len()))?;
    let got = match stored[1] {
        CODEC_ZSTD => ZSTD_D.with(|d| {
            let mut d = d.borrow_mut();
            if d.is_none() {
                *d = Some(zstd::bulk::Decompressor::new().map_err(|e| e.to_string())?);
            }
            d.as_mut()
                .expect("made above")
                .decompress_to_buffer(body, out)
                .map_err(|e| format!("zstd: {e}"))
        })?,
        CODEC_LZ4 => lz4_decompress(body, out)?,
        c => return Err(format!("unknown codec {c}")),
    };
    if got != out.len() {
        return Err(format!("decompressed to {got} bytes, not {}", out.len()));
    }
    Ok(())
}

/// lz4's block form decoded into `out` by the C reference decoder, which on the OS images'
/// grains of `bench/dedup.sh` takes 1.3 µs a grain where lz4_flex's safe decoder took 2.2 to
/// 2.7: it is the decoder for untrusted input, bounded by both buffers, and says how many
/// bytes it wrote or that the form is malformed.
fn lz4_decompress(body: &[u8], out: &mut [u8]) -> Result<usize, String> {
    let len = i32::try_from(body.len()).map_err(|_| "lz4: form too long".to_string())?;
    let room = i32::try_from(out.len()).map_err(|_| "lz4: grain too large".to_string())?;
    // SAFETY: LZ4_decompress_safe reads at most `len` bytes from `body` and writes at most
    // `room` bytes into `out`, both valid for that long, whatever the form holds.
    let n = unsafe { lz4_sys::LZ4_decompress_safe(body.as_ptr().cast(), out.as_mut_ptr().cast(), len, room) };
    usize::try_from(n).map_err(|_| "lz4: malformed form".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Every codec that compresses.
    const CODECS: [Compression; 3] = [Compression::Lz4, Compression::Zstd, Compression::Balanced];

    /// A grain of text-like bytes: the words picked, then dots to the grain's end.
    fn grain_of_words(words: &[usize]) -> Vec<u8> {
        let dict = [
            "the ", "grain ", "pool ", "of ", "a ", "vdisk ", "x", "\n", "0", "9", "zz", "  ",
        ];
        let mut g: Vec<u8> = words.iter().flat_map(|&w| dict[w].bytes()).collect();
        g.resize(4096, b'.');
        g
    }

    fn text(n: usize) -> Vec<u8> {
        (0..n).map(|i| b"the quick brown fox "[i % 20]).collect()
    }

    #[test]
    fn compressible_grains_round_trip_in_every_codec() {
        for c in CODECS {
            let g = text(4096);
            let s = c.compress(&g, 4096 - 512).expect("compresses");
            assert!(s.len() <= 4096 - 512);
            let mut padded = s.clone();
            padded.resize(s.len().div_ceil(512) * 512, 0);
            let mut out = vec![0u8; 4096];
            decompress(&padded, &mut out).unwrap();
            assert_eq!(out, g);
        }
    }

    /// `n` words of an xorshift generator started at `seed`.
    fn xorshift(seed: u64, n: usize) -> impl Iterator<Item = u64> {
        (0..n).scan(seed, |x, _| {
            *x ^= *x << 13;
            *x ^= *x >> 7;
            *x ^= *x << 17;
            Some(*x)
        })
    }

    fn noise(n: usize) -> Vec<u8> {
        xorshift(0x9e3779b97f4a7c15, n).map(|x| x as u8).collect()
    }

    /// Bytes drawn from 16 letters with no repeats to find: lz4 finds nothing to copy,
    /// zstd's entropy coding halves them.
    fn hex(n: usize) -> Vec<u8> {
        xorshift(0x2545f4914f6cdd1d, n)
            .map(|x| b"0123456789abcdef"[(x >> 60) as usize])
            .collect()
    }

    #[test]
    fn balanced_keeps_lz4_unless_zstd_saves_a_sixteenth_more() {
        let limit = 4096 - 512;
        let codec = |g: &[u8]| Compression::Balanced.compress(g, limit).map(|f| f[1]);
        // Repeats: both codecs shrink it to a few dozen bytes; lz4's is kept.
        assert_eq!(codec(&text(4096)), Some(CODEC_LZ4));
        // Hex: lz4 cannot save an eighth, zstd about half.
        assert!(Compression::Lz4.compress(&hex(4096), limit).is_none());
        assert_eq!(codec(&hex(4096)), Some(CODEC_ZSTD));
        // Hex then repeats: lz4 saves a little (its form is over half the grain), zstd a
        // sixteenth of the grain more.
        let mixed: Vec<u8> = hex(2560).into_iter().chain(text(1536)).collect();
        let (l, z) = (
            Compression::Lz4.compress(&mixed, limit).unwrap().len(),
            Compression::Zstd.compress(&mixed, limit).unwrap().len(),
        );
        assert!(l > 2048 && z + 256 <= l, "lz4 {l}, zstd {z}");
        assert_eq!(codec(&mixed), Some(CODEC_ZSTD));
        // Noise then repeats: lz4's form is over half the grain, and zstd cannot shrink
        // noise either, so it does not beat lz4 by a sixteenth: lz4.
        let near: Vec<u8> = noise(2100).into_iter().chain(text(1996)).collect();
        let (l, z) = (
            Compression::Lz4.compress(&near, limit).unwrap().len(),
            Compression::Zstd.compress(&near, limit).unwrap().len(),
        );
        assert!(l > 2048 && z + 256 > l, "lz4 {l}, zstd {z}");
        assert_eq!(codec(&near), Some(CODEC_LZ4));
        // A form of half the grain or less stays in lz4 even where zstd's is much shorter.
        let half: Vec<u8> = hex(1900).into_iter().chain(text(2196)).collect();
        let (l, z) = (
            Compression::Lz4.compress(&half, limit).unwrap().len(),
            Compression::Zstd.compress(&half, limit).unwrap().len(),
        );
        assert!(l <= 2048 && z + 256 <= l, "lz4 {l}, zstd {z}");
        assert_eq!(codec(&half), Some(CODEC_LZ4));
        let mut out = vec![0u8; 4096];
        for g in [text(4096), hex(4096), mixed, near, half] {
            decompress(&Compression::Balanced.compress(&g, limit).unwrap(), &mut out).unwrap();
            assert_eq!(out, g);
        }
    }

    #[test]
    fn what_would_not_save_a_sector_stays_plain() {
        let random = noise(4096);
        assert!(Compression::Zstd.compress(&random, 4096 - 512).is_none());
        assert!(Compression::Lz4.compress(&random, 4096 - 512).is_none());
        assert!(Compression::Balanced.compress(&random, 4096 - 512).is_none());
        assert!(Compression::Off.compress(&text(4096), 4096 - 512).is_none());
    }

    #[test]
    fn damaged_forms_are_errors() {
        let s = Compression::Zstd.compress(&text(4096), 4096 - 512).unwrap();
        let mut out = vec![0u8; 4096];
        let mut bad = s.clone();
        bad[0] ^= 1;
        assert!(decompress(&bad, &mut out).is_err());
        let mut long = s.clone();
        long[2..6].copy_from_slice(&100_000u32.to_le_bytes());
        assert!(decompress(&long, &mut out).is_err());
        // The right form into a grain of another size.
        let mut small = vec![0u8; 2048];
        assert!(decompress(&s, &mut small).is_err());
        assert!(decompress(&s[..3], &mut out).is_err());
    }

    /// A form cut short anywhere, in each codec, is an error: never a grain with a hole.
    #[test]
    fn forms_cut_short_are_errors() {
        for c in [Compression::Lz4, Compression::Zstd] {
            let s = c.compress(&hex(4096), 4096).unwrap();
            for cut in HEADER..s.len() {
                let mut short = s[..cut].to_vec();
                short[2..HEADER].copy_from_slice(&((cut - HEADER) as u32).to_le_bytes());
                let mut out = vec![0u8; 4096];
                assert!(
                    decompress(&short, &mut out).is_err(),
                    "{c:?} cut at {cut} of {}",
                    s.len()
                );
            }
        }
    }

    /// A form of a larger grain than the one it is read into is an error, and nothing is
    /// written past the smaller grain (the bytes after it in the same allocation stay as
    /// they were).
    #[test]
    fn forms_of_larger_grains_never_write_past_the_grain() {
        for c in [Compression::Lz4, Compression::Zstd] {
            for g in [text(4096), hex(4096)] {
                let s = c.compress(&g, 4096).unwrap();
                for grain in [0, 1, 2048, 4000, 4095] {
                    let mut out = vec![0xa5u8; 4096 + 256];
                    assert!(decompress(&s, &mut out[..grain]).is_err(), "{c:?} into {grain} bytes");
                    assert!(
                        out[grain..].iter().all(|&b| b == 0xa5),
                        "{c:?} wrote past {grain} bytes"
                    );
                }
            }
        }
    }

    /// Grains compressed before lz4's forms came from the C encoder (lz4_flex's, the same
    /// block format) read back.
    #[test]
    fn lz4_forms_of_the_earlier_encoder_read_back() {
        for g in [text(4096), hex(4096)] {
            let body = lz4_flex::block::compress(&g);
            let mut stored = vec![MAGIC, CODEC_LZ4];
            stored.extend_from_slice(&(body.len() as u32).to_le_bytes());
            stored.extend_from_slice(&body);
            stored.resize(stored.len().div_ceil(512) * 512, 0);
            let mut out = vec![0u8; 4096];
            decompress(&stored, &mut out).unwrap();
            assert_eq!(out, g);
        }
    }

    proptest! {
        /// Whatever room a form is given, it fits in it or there is none: an encoder never
        /// writes past the room (the C one is told it; a form cut short would not read back).
        #[test]
        fn forms_fit_the_room_given_or_there_is_none(
            words in proptest::collection::vec(0..12usize, 1..1200),
            limit in 0usize..4200,
            codec in 0..3usize,
        ) {
            let g = grain_of_words(&words);
            let c = CODECS[codec];
            if let Some(s) = c.compress(&g, limit) {
                prop_assert!(s.len() <= limit);
                let mut out = vec![0u8; 4096];
                decompress(&s, &mut out).unwrap();
                prop_assert_eq!(out, g);
            }
        }

        /// A form appended to a buffer is the form alone, after what the buffer held (which
        /// is left as it was), whatever room the buffer has past its end; no form, nothing
        /// added.
        #[test]
        fn forms_appended_follow_what_the_buffer_held(
            words in proptest::collection::vec(0..12usize, 1..1200),
            held in proptest::collection::vec(any::<u8>(), 0..3000),
            spare in 0usize..9000,
            limit in 0usize..4200,
            codec in 0..3usize,
        ) {
            let g = grain_of_words(&words);
            let c = CODECS[codec];
            let mut out = Vec::with_capacity(held.len() + spare);
            out.extend_from_slice(&held);
            let alone = c.compress(&g, limit);
            match c.compress_into(&g, limit, &mut out) {
                Some(n) => {
                    prop_assert_eq!(out.len(), held.len() + n);
                    prop_assert_eq!(&out[..held.len()], &held[..]);
                    prop_assert_eq!(Some(&out[held.len()..]), alone.as_deref());
                }
                None => {
                    prop_assert_eq!(&out, &held);
                    prop_assert!(alone.is_none());
                }
            }
        }

        #[test]
        fn any_grain_round_trips_or_stays_plain(
            runs in proptest::collection::vec((any::<u8>(), 1usize..600), 1..40),
            codec in 0..3usize,
        ) {
            let mut g: Vec<u8> = runs.iter().flat_map(|&(b, n)| std::iter::repeat_n(b, n)).collect();
            g.resize(4096, 7);
            let c = CODECS[codec];
            if let Some(s) = c.compress(&g, 4096 - 512) {
                prop_assert!(s.len().div_ceil(512) * 512 <= 4096 - 512);
                let mut out = vec![0u8; 4096];
                decompress(&s, &mut out).unwrap();
                prop_assert_eq!(out, g);
            }
        }

        #[test]
        fn garbage_never_decompresses_to_the_wrong_size_silently(garbage in proptest::collection::vec(any::<u8>(), 0..600)) {
            let mut out = vec![0u8; 4096];
            // Either an error, or a full grain (a valid form can be typed by chance).
            let _ = decompress(&garbage, &mut out);
        }

        /// Garbage behind a well-formed header, in each codec and into any size of grain, is
        /// an error or fills the grain exactly, and the decoders write nothing past the grain
        /// they are given (the bytes after it in the same allocation stay as they were).
        #[test]
        fn garbage_bodies_never_write_past_the_grain(
            codec in prop_oneof![Just(CODEC_ZSTD), Just(CODEC_LZ4)],
            body in proptest::collection::vec(any::<u8>(), 0..2000),
            grain in 0usize..9000,
        ) {
            let mut stored = vec![MAGIC, codec];
            stored.extend_from_slice(&(body.len() as u32).to_le_bytes());
            stored.extend_from_slice(&body);
            let mut out = vec![0xa5u8; grain + 256];
            let _ = decompress(&stored, &mut out[..grain]);
            prop_assert!(out[grain..].iter().all(|&b| b == 0xa5));
        }
    }
}
