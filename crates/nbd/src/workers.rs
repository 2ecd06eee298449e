//! The threads that run a connection's requests that may block: writes (which may allocate
//! and commit metadata), flushes, trims, block status, and reads the engine cannot plan for
//! the connection's ring. Started as jobs queue up with none idle, up to MAX_WORKERS, and
//! ended with the connection. Each finished reply is handed back to the connection loop,
//! which an eventfd wakes.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use tessera_disk::{eventfd, AlignedBuf};
use tracing::warn;

use crate::proto::{cmd, errno, Request};
use crate::transmission::{error_reply, execute, read_batch, Ctx, Reply};

/// Worker threads per connection, at most: enough for a client's queue of large writes to be
/// in flight together.
const MAX_WORKERS: usize = 16;

/// A request for a worker, with a WRITE's payload (empty for other commands).
pub(crate) struct Job {
    pub req: Request,
    pub payload: AlignedBuf,
}

pub(crate) struct Workers {
    shared: Arc<Shared>,
    handles: Vec<JoinHandle<()>>,
    /// Readable while finished replies wait in `done`.
    ready: OwnedFd,
}

struct Shared {
    ctx: Arc<Ctx>,
    state: Mutex<State>,
    wake: Condvar,
    /// Finished replies, each with the bytes its request was charged.
    done: Mutex<Vec<(Reply, usize)>>,
    ready: RawFd,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Job>,
    /// Threads waiting for a job, and wake-ups sent to them not yet taken: a job queued
    /// while every waiting thread is already woken for another gets a new thread.
    waiting: usize,
    wakeups: usize,
    threads: usize,
    closed: bool,
}

/// A worker that panicked left the queue as it was; the connection goes on.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Workers {
    pub fn new(ctx: Arc<Ctx>) -> io::Result<Workers> {
        let ready = eventfd::open()?;
        let fd = ready.as_raw_fd();
        Ok(Workers {
            shared: Arc::new(Shared {
                ctx,
                state: Mutex::new(State::default()),
                wake: Condvar::new(),
                done: Mutex::new(Vec::new()),
                ready: fd,
            }),
            handles: Vec::new(),
            ready,
        })
    }

    /// The descriptor that is readable while replies are ready to collect.
    pub fn ready_fd(&self) -> RawFd {
        self.ready.as_raw_fd()
    }

    /// Queues a job; gives it back when no thread can take it (none could be started), for
    /// the caller to run itself.
    pub fn submit(&mut self, job: Job) -> Option<Job> {
        let mut st = lock(&self.shared.state);
        if st.waiting > st.wakeups {
            st.wakeups += 1;
        } else if st.threads < MAX_WORKERS {
            match start_worker(self.shared.clone()) {
                Ok(h) => {
                    st.threads += 1;
                    self.handles.push(h);
                }
                Err(e) if st.threads == 0 => {
                    warn!(error = %e, "cannot start an NBD worker; the request runs on the connection's thread");
                    return Some(job);
                }
                Err(e) => warn!(error = %e, "cannot start another NBD worker; the connection goes on with fewer"),
            }
        }
        st.queue.push_back(job);
        drop(st);
        self.shared.wake.notify_one();
        None
    }

    /// The replies finished since the last call, each with its request's charge.
    pub fn collect(&self) -> Vec<(Reply, usize)> {
        // Reset the eventfd before taking the replies: one finished after this is signalled
        // again, so the loop cannot sleep with a reply waiting.
        eventfd::clear(self.ready.as_raw_fd());
        std::mem::take(&mut *lock(&self.shared.done))
    }
}

impl Drop for Workers {
    /// Workers finish the jobs already queued, then end.
    fn drop(&mut self) {
        lock(&self.shared.state).closed = true;
        self.shared.wake.notify_all();
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

/// Makes starting a worker fail, as on a machine out of threads, for this crate's tests of
/// what a connection does then (inline_tests.rs).
#[cfg(test)]
pub(crate) static NO_WORKER_THREADS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn start_worker(shared: Arc<Shared>) -> io::Result<JoinHandle<()>> {
    #[cfg(test)]
    if NO_WORKER_THREADS.load(std::sync::atomic::Ordering::SeqCst) {
        return Err(io::Error::from_raw_os_error(libc::EAGAIN));
    }
    std::thread::Builder::new()
        .name("nbd-worker".into())
        .spawn(move || work(&shared))
}

fn work(shared: &Shared) {
    loop {
        let job = {
            let mut st = lock(&shared.state);
            loop {
                if let Some(job) = st.queue.pop_front() {
                    break job;
                }
                if st.closed {
                    return;
                }
                st.waiting += 1;
                st = shared.wake.wait(st).unwrap_or_else(|e| e.into_inner());
                st.waiting -= 1;
                st.wakeups = st.wakeups.saturating_sub(1);
            }
        };
        let charged = crate::transmission::charge(&job.req);
        let req = job.req;
        // A request that panics is answered with an error; the connection goes on (the
        // engine's locks are let go as the panic unwinds).
        let reply = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&shared.ctx, job)))
            .unwrap_or_else(|_| error_reply(&shared.ctx, &req, errno::EIO, "the request failed inside the server"));
        lock(&shared.done).push((reply, charged));
        // Open while the Workers that joins this thread lives.
        eventfd::ring(shared.ready);
    }
}

/// Runs a job on the calling thread.
pub(crate) fn run(ctx: &Ctx, job: Job) -> Reply {
    if job.req.kind == cmd::READ {
        return read_batch(ctx, &[job.req]);
    }
    let reply = execute(ctx, &job.req, &job.payload);
    ctx.buffers.give_back(job.payload);
    reply
}
