//! `tessera-linkem`: make an emulated WAN link between two network namespaces and hold it
//! (`run`), or measure a plain TCP copy across one (`measure`).

use std::io::BufRead;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use tessera_linkem::{parse_duration, parse_fraction, parse_rate, Link, Shape, Transfer, A_ADDR, B_ADDR};

#[derive(Parser)]
#[command(
    name = "tessera-linkem",
    about = "A user-space WAN emulator: two network namespaces joined by a link with set bandwidth, delay, jitter, loss and reordering"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Make the link and hold it until stdin closes or a line "quit" is read. Lines "cut" and
    /// "mend" drop every packet and stop doing so; "stats" prints what each way carried.
    Run {
        /// The namespaces are PREFIX-a (10.99.0.1) and PREFIX-b (10.99.0.2).
        #[arg(long, default_value = "linkem")]
        name: String,
        #[command(flatten)]
        link: LinkArgs,
    },
    /// Copy over TCP from a to b across a fresh link and print the goodput as JSON.
    Measure {
        #[command(flatten)]
        link: LinkArgs,
        /// Congestion control of the sending sockets (cubic, bbr, reno).
        #[arg(long, default_value = "cubic")]
        cc: String,
        #[arg(long, default_value_t = 1)]
        streams: usize,
        /// Seconds before counting, for the streams to leave slow start.
        #[arg(long, default_value = "3s", value_parser = parse_duration)]
        warmup: Duration,
        /// Seconds counted.
        #[arg(long, default_value = "15s", value_parser = parse_duration)]
        window: Duration,
    },
}

#[derive(Args)]
struct LinkArgs {
    /// Bandwidth each way, e.g. 100mbit (0: unlimited).
    #[arg(long, value_parser = parse_rate)]
    rate: u64,
    /// Round-trip time added, split evenly between the two ways.
    #[arg(long, value_parser = parse_duration)]
    rtt: Duration,
    /// Random loss each way, e.g. 1%.
    #[arg(long, default_value = "0", value_parser = parse_fraction)]
    loss: f64,
    /// Each packet's one-way delay varies within ± this.
    #[arg(long, default_value = "0", value_parser = parse_duration)]
    jitter: Duration,
    /// Share of packets held back 5 ms, so that others overtake them.
    #[arg(long, default_value = "0", value_parser = parse_fraction)]
    reorder: f64,
    /// Queue in front of each way's transmitter, in bytes (default: one bandwidth-delay
    /// product, at least 64 KiB).
    #[arg(long)]
    queue: Option<u64>,
}

impl LinkArgs {
    fn shape(&self) -> Shape {
        let mut s = Shape::new(self.rate, self.rtt);
        s.loss = self.loss;
        s.jitter = self.jitter;
        s.reorder = self.reorder;
        if let Some(q) = self.queue {
            s.queue_bytes = q;
        }
        s
    }

    fn start(&self, name: &str) -> Result<Link, String> {
        if let Some(why) = tessera_linkem::unavailable() {
            return Err(why);
        }
        Link::start(name, self.shape(), self.shape()).map_err(|e| e.to_string())
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Run { name, link } => run(&name, &link),
        Cmd::Measure {
            link,
            cc,
            streams,
            warmup,
            window,
        } => link.start(&format!("linkem-m{}", std::process::id())).and_then(|l| {
            let t = Transfer {
                streams,
                congestion: cc,
                warmup,
                window,
            };
            let r = tessera_linkem::measure(&l, &t).map_err(|e| e.to_string())?;
            let mut v = serde_json::to_value(&r).expect("serializable");
            v["link_rate_bps"] = link.rate.into();
            v["ratio"] = (r.goodput_bps / link.rate.max(1) as f64).into();
            v["link"] = serde_json::to_value(l.stats()).expect("serializable");
            println!("{v}");
            Ok(())
        }),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tessera-linkem: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(name: &str, args: &LinkArgs) -> Result<(), String> {
    let link = args.start(name)?;
    println!(
        "{}",
        serde_json::json!({"a": link.a.name, "b": link.b.name, "a_addr": A_ADDR.to_string(), "b_addr": B_ADDR.to_string()})
    );
    for line in std::io::stdin().lock().lines() {
        match line.as_deref().map(str::trim) {
            Ok("cut") => link.set_cut(true),
            Ok("mend") => link.set_cut(false),
            Ok("stats") => println!("{}", serde_json::to_value(link.stats()).expect("serializable")),
            Ok("quit") | Err(_) => break,
            Ok(other) => eprintln!("tessera-linkem: '{other}' is not a command: cut, mend, stats or quit"),
        }
    }
    Ok(())
}
