//! `tessera events`: the event log, and following it.

use std::io::Write;

use tessera_server::api::events::EventList;
use tessera_server::events::Event;

use super::*;

pub(super) fn events(c: &Ctx, a: EventsArgs) -> R {
    let mut query = vec![format!("limit={}", a.limit)];
    if let Some(s) = &a.after {
        query.push(format!("after={s}"));
    }
    if let Some(s) = &a.severity {
        query.push(format!("severity={}", encode_segment(s)));
    }
    if let Some(p) = &a.pool {
        query.push(format!("pool={}", encode_segment(p)));
    }
    let v = c.client.get(&format!("/api/events?{}", query.join("&")))?;
    let list: EventList = read(v.clone())?;
    if !a.follow {
        if c.json {
            c.print_json(&v);
        } else if list.events.is_empty() {
            println!("(no events)");
        }
        if !c.json {
            list.events.iter().for_each(print_event);
        }
        return Ok(());
    }
    // Following: what is recorded, then each new event on a line of its own (JSON lines with
    // --json), from where the list ended.
    for e in &list.events {
        emit(c, e);
    }
    let after = list.events.last().map(|e| e.seq).unwrap_or(list.next_seq - 1);
    query.retain(|q| !q.starts_with("limit=") && !q.starts_with("after="));
    query.push(format!("after={after}"));
    let mut broken = None;
    c.client
        .stream_lines(&format!("/api/events/stream?{}", query.join("&")), |line| {
            let Some(data) = line.strip_prefix("data:") else {
                return true;
            };
            match serde_json::from_str::<Event>(data.trim_start()) {
                Ok(e) => {
                    emit(c, &e);
                    true
                }
                Err(err) => {
                    broken = Some(format!("the daemon sent an event this tessera cannot read ({err})"));
                    false
                }
            }
        })?;
    match broken {
        Some(why) => Err(ClientError::Transport(why)),
        None => Err(ClientError::Transport(
            "the daemon ended the stream (it is stopping)".into(),
        )),
    }
}

fn emit(c: &Ctx, e: &Event) {
    if c.json {
        println!("{}", serde_json::to_string(e).expect("serializable"));
    } else {
        print_event(e);
    }
    let _ = std::io::stdout().flush();
}

fn print_event(e: &Event) {
    let repeats = match e.repeats {
        0 => String::new(),
        n => format!(" (and {n} like it in the minute before)"),
    };
    println!(
        "{}  #{:<5} {:<8} {:<22} {}{repeats}",
        when(e.time as u64),
        e.seq,
        e.severity.as_str(),
        e.kind,
        e.message
    );
}
