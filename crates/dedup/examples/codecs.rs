//! What each way of compressing 4 KiB grains saves, and what it costs to compress and to
//! read back, on the distinct non-zero grains of the image files given (as a dedup run would
//! leave them): the figures behind the choice of zstd level 1 (docs/performance.md).
//!
//! Stored sizes count as a pack does: the six-byte header, rounded up to 16-byte units, and a
//! grain that would not save an eighth stays plain. Times are per grain on one core.
//!
//! Usage: cargo run --release -p tessera-dedup --example codecs -- IMAGE...

use std::collections::HashSet;
use std::time::Instant;

use tessera_dedup::{decompress, Compression};

const GRAIN: usize = 4096;
/// The header each stored form starts with.
const HEADER: usize = 6;
/// The stored form: header, compressed bytes, 16-byte units.
fn stored(compressed: usize) -> usize {
    (compressed + HEADER).div_ceil(16) * 16
}
/// A grain stays plain unless its form saves an eighth of it.
fn kept(compressed: usize) -> Option<usize> {
    let s = stored(compressed);
    (s <= GRAIN - GRAIN / 8).then_some(s)
}

struct Codec {
    name: String,
    /// Per grain: the stored size, and nanoseconds to decompress (0 when kept plain).
    sizes: Vec<usize>,
    decompress_ns: Vec<f64>,
    compress_ns: f64,
}

fn zstd_codec(level: i32, grains: &[&[u8]]) -> Codec {
    let mut c = zstd::bulk::Compressor::new(level).expect("a zstd context");
    let mut d = zstd::bulk::Decompressor::new().expect("a zstd context");
    let t = Instant::now();
    let forms: Vec<Vec<u8>> = grains.iter().map(|g| c.compress(g).expect("compresses")).collect();
    let compress_ns = t.elapsed().as_nanos() as f64 / grains.len() as f64;
    let mut out = vec![0u8; GRAIN];
    measure(format!("zstd {level}"), &forms, 0, compress_ns, |f| {
        d.decompress_to_buffer(f, &mut out).expect("decompresses");
    })
}

/// lz4 as the pools compress and read it (the crate's own forms, with their header), so
/// that its times are those of the encoder and decoder a run and a read use.
fn lz4_codec(grains: &[&[u8]]) -> Codec {
    let t = Instant::now();
    let forms: Vec<Vec<u8>> = grains
        .iter()
        .map(|g| Compression::Lz4.compress(g, 2 * GRAIN).expect("any grain fits in two"))
        .collect();
    let compress_ns = t.elapsed().as_nanos() as f64 / grains.len() as f64;
    let mut out = vec![0u8; GRAIN];
    measure("lz4".into(), &forms, HEADER, compress_ns, |f| {
        decompress(f, &mut out).expect("decompresses");
    })
}

/// Times each kept form's decompression (best of three, to leave out the machine's noise).
/// `header`: bytes of each form that are already a header (the sizes count one anyway).
fn measure(
    name: String,
    forms: &[Vec<u8>],
    header: usize,
    compress_ns: f64,
    mut decompress: impl FnMut(&[u8]),
) -> Codec {
    let mut sizes = Vec::with_capacity(forms.len());
    let mut decompress_ns = Vec::with_capacity(forms.len());
    for f in forms {
        match kept(f.len() - header) {
            Some(s) => {
                let best = (0..3)
                    .map(|_| {
                        let t = Instant::now();
                        decompress(f);
                        t.elapsed().as_nanos() as f64
                    })
                    .fold(f64::MAX, f64::min);
                sizes.push(s);
                decompress_ns.push(best);
            }
            None => {
                sizes.push(GRAIN);
                decompress_ns.push(0.0);
            }
        }
    }
    Codec {
        name,
        sizes,
        decompress_ns,
        compress_ns,
    }
}

fn report(name: &str, input: u64, unique: usize, sizes: impl Iterator<Item = usize>, ns: f64) {
    let stored: u64 = sizes.map(|s| s as u64).sum();
    println!(
        "| {name} | {:.1} MB | {:.2} % | {:.2} |",
        stored as f64 / 1e6,
        100.0 * (1.0 - stored as f64 / input as f64),
        ns / unique as f64 / 1000.0
    );
}

fn main() {
    let files: Vec<String> = std::env::args().skip(1).collect();
    if files.is_empty() {
        eprintln!("usage: codecs IMAGE...");
        std::process::exit(2);
    }
    let mut input = 0u64;
    let mut seen = HashSet::new();
    let mut data = Vec::new();
    for f in &files {
        let bytes = std::fs::read(f).unwrap_or_else(|e| panic!("{f}: {e}"));
        input += bytes.len() as u64;
        data.push(bytes);
    }
    let grains: Vec<&[u8]> = data
        .iter()
        .flat_map(|d| d.chunks_exact(GRAIN))
        .filter(|g| g.iter().any(|&b| b != 0) && seen.insert(*blake3::hash(g).as_bytes()))
        .collect();
    println!(
        "{} files, {:.2} GB, {} distinct non-zero 4 KiB grains ({:.2} GB)\n",
        files.len(),
        input as f64 / 1e9,
        grains.len(),
        (grains.len() * GRAIN) as f64 / 1e9
    );
    let codecs: Vec<Codec> = [1, 3, -1]
        .into_iter()
        .map(|l| zstd_codec(l, &grains))
        .chain(std::iter::once(lz4_codec(&grains)))
        .collect();
    println!("| codec | stored | saved | µs to compress a grain |");
    println!("|---|---:|---:|---:|");
    for c in &codecs {
        println!(
            "| {} | {:.1} MB | {:.2} % | {:.2} |",
            c.name,
            c.sizes.iter().sum::<usize>() as f64 / 1e6,
            100.0 * (1.0 - c.sizes.iter().sum::<usize>() as f64 / input as f64),
            c.compress_ns / 1000.0
        );
    }
    println!("\n| grains stored with | stored | saved | µs to read a grain back, on average |");
    println!("|---|---:|---:|---:|");
    for c in &codecs {
        report(
            &c.name,
            input,
            grains.len(),
            c.sizes.iter().copied(),
            c.decompress_ns.iter().sum(),
        );
    }
    // Each grain in whichever of zstd 1 and lz4 costs it less, counting a nanosecond of
    // decompression as `weight` bytes: the best a per-grain choice of the two can do.
    let (z, l) = (&codecs[0], &codecs[3]);
    for weight in [0.05, 0.1, 0.2, 0.4] {
        let pick: Vec<usize> = (0..grains.len())
            .map(|i| {
                let cost = |c: &Codec| c.sizes[i] as f64 + weight * c.decompress_ns[i];
                if cost(l) <= cost(z) {
                    3
                } else {
                    0
                }
            })
            .collect();
        report(
            &format!("zstd 1 or lz4, a ns worth {weight} B"),
            input,
            grains.len(),
            pick.iter().enumerate().map(|(i, &c)| codecs[c].sizes[i]),
            pick.iter().enumerate().map(|(i, &c)| codecs[c].decompress_ns[i]).sum(),
        );
    }
}
