//! What the link does to each packet of one direction, as netem would: random loss at the
//! entrance, a drop-tail queue in front of a transmitter of a set rate, then a propagation
//! delay with jitter, and some packets held back longer (reordering). Pure arithmetic on
//! times, so that it is tested without a network.

use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// One direction of the link.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shape {
    /// Bits per second the transmitter sends; 0: no limit.
    pub rate_bps: u64,
    /// One-way propagation delay.
    pub delay: Duration,
    /// Each packet's delay varies uniformly within ± this (packets may then overtake each
    /// other, as with netem's jitter).
    pub jitter: Duration,
    /// Probability (0..1) that a packet is lost, each independently.
    pub loss: f64,
    /// Probability (0..1) that a packet is held back by `reorder_delay` more, so that those
    /// behind it arrive first.
    pub reorder: f64,
    pub reorder_delay: Duration,
    /// Bytes the queue in front of the transmitter holds; a packet that does not fit is
    /// dropped (a router's drop-tail buffer).
    pub queue_bytes: u64,
}

impl Shape {
    /// A direction of `rate_bps` with a queue of one bandwidth-delay product of `rtt` (at
    /// least 64 KiB), as a well-sized router buffer has.
    pub fn new(rate_bps: u64, rtt: Duration) -> Shape {
        let bdp = (rate_bps as f64 / 8.0 * rtt.as_secs_f64()) as u64;
        Shape {
            rate_bps,
            delay: rtt / 2,
            jitter: Duration::ZERO,
            loss: 0.0,
            reorder: 0.0,
            reorder_delay: Duration::from_millis(5),
            queue_bytes: bdp.max(64 << 10),
        }
    }
}

/// Why a packet did not get through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Delivered at this time.
    Deliver(Instant),
    /// Lost at random.
    Lost,
    /// The queue was full.
    Overflow,
}

/// The state of one direction: when its transmitter is free again.
pub struct Shaper {
    shape: Shape,
    rng: StdRng,
    /// When the transmitter finishes the last packet queued.
    free_at: Option<Instant>,
}

impl Shaper {
    pub fn new(shape: Shape, seed: u64) -> Shaper {
        Shaper {
            shape,
            rng: StdRng::seed_from_u64(seed),
            free_at: None,
        }
    }

    /// The fate of a packet of `bytes` arriving at `now`.
    pub fn admit(&mut self, now: Instant, bytes: usize) -> Fate {
        let s = &self.shape;
        if s.loss > 0.0 && self.rng.random::<f64>() < s.loss {
            return Fate::Lost;
        }
        let start = match self.free_at {
            Some(t) if t > now => t,
            _ => now,
        };
        let departs = if s.rate_bps == 0 {
            start
        } else {
            // Bytes still to send before this one: what the queue holds.
            let backlog = (start - now).as_secs_f64() * s.rate_bps as f64 / 8.0;
            if backlog + bytes as f64 > s.queue_bytes as f64 {
                return Fate::Overflow;
            }
            start + Duration::from_secs_f64(bytes as f64 * 8.0 / s.rate_bps as f64)
        };
        self.free_at = Some(departs);
        let mut arrives = departs + s.delay;
        if !s.jitter.is_zero() {
            let j = s.jitter.as_secs_f64();
            let offset = self.rng.random_range(-j..=j);
            arrives = if offset >= 0.0 {
                arrives + Duration::from_secs_f64(offset)
            } else {
                arrives
                    .checked_sub(Duration::from_secs_f64(-offset))
                    .unwrap_or(departs)
                    .max(departs)
            };
        }
        if s.reorder > 0.0 && self.rng.random::<f64>() < s.reorder {
            arrives += s.reorder_delay;
        }
        Fate::Deliver(arrives)
    }
}

/// Reads "100mbit", "10Mbit", "1.5gbit", "800kbit" or plain bits per second.
pub fn parse_rate(s: &str) -> Result<u64, String> {
    let t = s.trim().to_ascii_lowercase();
    let (num, mult) = [("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("bit", 1.0)]
        .iter()
        .find_map(|(suffix, m)| t.strip_suffix(suffix).map(|n| (n, *m)))
        .unwrap_or((t.as_str(), 1.0));
    match num.trim().parse::<f64>() {
        Ok(v) if v >= 0.0 && v.is_finite() => Ok((v * mult) as u64),
        _ => Err(format!("'{s}' is not a rate: write e.g. 100mbit, 10Mbit or 800kbit")),
    }
}

/// Reads "90ms", "1.5s", "250us" or "0".
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim().to_ascii_lowercase();
    let (num, unit) = [("ms", 1e-3), ("us", 1e-6), ("s", 1.0)]
        .iter()
        .find_map(|(suffix, u)| t.strip_suffix(suffix).map(|n| (n, *u)))
        .unwrap_or((t.as_str(), if t == "0" { 1.0 } else { f64::NAN }));
    match num.trim().parse::<f64>() {
        Ok(v) if v >= 0.0 && (v * unit).is_finite() => Ok(Duration::from_secs_f64(v * unit)),
        _ => Err(format!("'{s}' is not a duration: write e.g. 90ms, 1.5s or 250us")),
    }
}

/// Reads "1%", "0.1%" or a fraction "0.01".
pub fn parse_fraction(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let v = match t.strip_suffix('%') {
        Some(p) => p.trim().parse::<f64>().map(|v| v / 100.0),
        None => t.parse::<f64>(),
    };
    match v {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("'{s}' is not a probability: write e.g. 1% or 0.01")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn packets_leave_at_the_rate_and_arrive_a_delay_later() {
        // 8 Mbit/s: a 1000-byte packet takes 1 ms to send.
        let mut s = Shaper::new(Shape::new(8_000_000, ms(100)), 1);
        let t0 = Instant::now();
        let arrivals: Vec<_> = (0..5)
            .map(|_| match s.admit(t0, 1000) {
                Fate::Deliver(t) => t - t0,
                f => panic!("{f:?}"),
            })
            .collect();
        assert_eq!(arrivals, (1..=5).map(|k| ms(50) + ms(k)).collect::<Vec<_>>());
        // An idle link sends at once.
        match s.admit(t0 + ms(500), 1000) {
            Fate::Deliver(t) => assert_eq!(t - t0, ms(500) + ms(1) + ms(50)),
            f => panic!("{f:?}"),
        }
    }

    #[test]
    fn a_full_queue_drops_what_does_not_fit() {
        let mut shape = Shape::new(8_000_000, ms(10));
        shape.queue_bytes = 10_000;
        let mut s = Shaper::new(shape, 1);
        let t0 = Instant::now();
        let fates: Vec<_> = (0..12).map(|_| s.admit(t0, 1000)).collect();
        let delivered = fates.iter().filter(|f| matches!(f, Fate::Deliver(_))).count();
        assert_eq!(delivered, 10);
        assert!(fates[10..].iter().all(|f| *f == Fate::Overflow));
        // Once the transmitter has sent some, there is room again.
        assert!(matches!(s.admit(t0 + ms(3), 1000), Fate::Deliver(_)));
    }

    #[test]
    fn loss_jitter_and_reordering_happen_as_often_as_asked() {
        let mut shape = Shape::new(0, ms(20));
        shape.loss = 0.05;
        shape.jitter = ms(2);
        shape.reorder = 0.1;
        let mut s = Shaper::new(shape, 7);
        let t0 = Instant::now();
        let n = 20_000;
        let mut lost = 0;
        let mut held = 0;
        for k in 0..n {
            let now = t0 + Duration::from_micros(k * 10);
            match s.admit(now, 100) {
                Fate::Lost => lost += 1,
                Fate::Deliver(t) => {
                    let d = t - now;
                    assert!(d >= ms(8) && d <= ms(12) + ms(5), "{d:?}");
                    if d > ms(12) {
                        held += 1;
                    }
                }
                Fate::Overflow => panic!("no rate, no queue"),
            }
        }
        let lost = lost as f64 / n as f64;
        assert!((0.04..0.06).contains(&lost), "{lost}");
        let held = held as f64 / n as f64;
        assert!((0.08..0.12).contains(&held), "{held}");
    }

    #[test]
    fn rates_durations_and_fractions_parse_or_say_why_not() {
        assert_eq!(parse_rate("100mbit"), Ok(100_000_000));
        assert_eq!(parse_rate("10Mbit"), Ok(10_000_000));
        assert_eq!(parse_rate("1.5gbit"), Ok(1_500_000_000));
        assert_eq!(parse_rate("64000"), Ok(64_000));
        assert!(parse_rate("fast").unwrap_err().contains("not a rate"));
        assert_eq!(parse_duration("90ms"), Ok(ms(90)));
        assert_eq!(parse_duration("1.5s"), Ok(ms(1500)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert!(parse_duration("90").is_err());
        assert_eq!(parse_fraction("1%"), Ok(0.01));
        assert_eq!(parse_fraction("0.07"), Ok(0.07));
        assert!(parse_fraction("120%").is_err());
    }
}
