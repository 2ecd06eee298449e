//! The commands of a session received and not yet answered, and which of them a task
//! management function aborted. An aborted command runs to its end (its I/O cannot be
//! called back once the backend has it), its answer is not sent (RFC 7143 4.2.3.4), and the
//! function is answered only once it has ended (SAM-5 7.x: FUNCTION COMPLETE means the
//! commands are gone): a host told at once would send the write again, or newer data to the
//! same blocks, perhaps down another path, and the old write could land over it.

use std::collections::HashMap;

use parking_lot::{Condvar, Mutex};

struct Task {
    /// The logical unit it was sent to (as the LUN field addresses it).
    lun: u64,
    aborted: bool,
}

#[derive(Default)]
pub(super) struct Running {
    tasks: Mutex<HashMap<u32, Task>>,
    /// Rung when an aborted command ends.
    ended: Condvar,
}

impl Running {
    /// A command of tag `itt`, to logical unit `lun`, is received and will be answered.
    pub(super) fn start(&self, itt: u32, lun: u64) {
        self.tasks.lock().insert(itt, Task { lun, aborted: false });
    }

    /// Whether a command of tag `itt` is received and not yet answered.
    pub(super) fn contains(&self, itt: u32) -> bool {
        self.tasks.lock().contains_key(&itt)
    }

    /// The commands `itts` ended; for each, whether it was aborted (it gets no answer).
    pub(super) fn finish(&self, itts: impl Iterator<Item = u32>) -> Vec<bool> {
        let mut tasks = self.tasks.lock();
        let aborted: Vec<bool> = itts.map(|itt| tasks.remove(&itt).is_some_and(|t| t.aborted)).collect();
        if aborted.iter().any(|&a| a) {
            self.ended.notify_all();
        }
        aborted
    }

    /// Marks aborted the commands that `which` (tag, logical unit) selects; their tags.
    pub(super) fn abort(&self, which: impl Fn(u32, u64) -> bool) -> Vec<u32> {
        let mut tasks = self.tasks.lock();
        tasks
            .iter_mut()
            .filter(|(&itt, t)| which(itt, t.lun))
            .map(|(&itt, t)| {
                t.aborted = true;
                itt
            })
            .collect()
    }

    /// Takes the abort of the commands `itts` back: they are answered as if it never came.
    pub(super) fn unabort(&self, itts: &[u32]) {
        let mut tasks = self.tasks.lock();
        for itt in itts {
            if let Some(t) = tasks.get_mut(itt) {
                t.aborted = false;
            }
        }
    }

    /// Waits until none of the commands `itts` runs any more.
    pub(super) fn wait_ended(&self, itts: &[u32]) {
        let mut tasks = self.tasks.lock();
        while itts.iter().any(|itt| tasks.contains_key(itt)) {
            self.ended.wait(&mut tasks);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    #[test]
    fn an_abort_waits_for_the_commands_it_took_and_no_other() {
        let r = Arc::new(Running::default());
        r.start(1, 0);
        r.start(2, 0);
        r.start(3, 1);
        let taken = r.abort(|_, lun| lun == 0);
        let mut sorted = taken.clone();
        sorted.sort();
        assert_eq!(sorted, vec![1, 2]);
        let waiter = {
            let r = r.clone();
            std::thread::spawn(move || r.wait_ended(&taken))
        };
        assert_eq!(r.finish([3].into_iter()), vec![false], "not aborted: answered");
        assert_eq!(r.finish([1].into_iter()), vec![true]);
        std::thread::sleep(Duration::from_millis(50));
        assert!(!waiter.is_finished(), "command 2 still runs");
        assert_eq!(r.finish([2].into_iter()), vec![true]);
        waiter.join().unwrap();
        // A tag not running (answered already, or never received): nothing to wait for.
        assert!(r.abort(|itt, _| itt == 1).is_empty());
        r.wait_ended(&[1]);
    }
}
