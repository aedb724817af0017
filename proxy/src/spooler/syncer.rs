//! The spool's sync thread: the fsyncs that make spooled WAL durable, off the writer's path.
//!
//! Standbys read what the writer appended (the page cache), so they never needed the fsync;
//! only the durable end does (the upstream lets the primary's slot advance to it). When the
//! writer thread made the fsyncs itself, every periodic sync and every filled segment stopped
//! it from appending for as long as the disk took (under a bulk load on a shared disk, a third
//! of the time: up to the 100 ms period and more), and the standbys waited with it. Now the
//! writer hands [`Durability`] jobs here over a queue of [`QUEUE`] (it blocks when the disk
//! is that far behind, bounding the work in flight) and goes on appending; this thread does
//! them in order (see `crate::spool::durable` for the three steps) and publishes each new
//! durable end after its `spool.state` is written.
//!
//! Ops that change the spool otherwise (a timeline switch, binding, the final sync) wait for
//! the queue to drain first ([`Syncer::drain`]).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex};

use super::lock;
use super::writing::Writing;
use crate::metrics::timed_wall;
use crate::spool::{Durability, SpoolError};

/// Jobs the sync thread's queue holds (a filled segment each, or the periodic sync).
pub const QUEUE: usize = 8;

enum Msg {
    Job(Durability),
    /// Answered once every earlier job is done.
    Drain(std_mpsc::SyncSender<()>),
}

/// The writer's handle on the sync thread.
pub struct Syncer {
    tx: std_mpsc::SyncSender<Msg>,
}

impl Syncer {
    /// Starts the thread, which works on `writing`'s spool.
    pub fn start(writing: Arc<Mutex<Writing>>) -> std::io::Result<Syncer> {
        let (tx, rx) = std_mpsc::sync_channel(QUEUE);
        std::thread::Builder::new()
            .name("walrelay-spool-sync".into())
            .spawn(move || run(&writing, rx))?;
        Ok(Syncer { tx })
    }

    /// Queues `job`, waiting while the queue is full; false if the thread is gone.
    pub fn send(&self, job: Durability) -> bool {
        self.tx.send(Msg::Job(job)).is_ok()
    }

    /// Waits until every job sent so far is done (or the thread is gone).
    pub fn drain(&self) {
        let (tx, rx) = std_mpsc::sync_channel(1);
        if self.tx.send(Msg::Drain(tx)).is_ok() {
            let _ = rx.recv();
        }
    }
}

fn run(writing: &Mutex<Writing>, rx: std_mpsc::Receiver<Msg>) {
    while let Ok(msg) = rx.recv() {
        match msg {
            Msg::Drain(done) => {
                let _ = done.send(());
            }
            Msg::Job(job) => {
                let data = job.is_data();
                let r = do_job(writing, job);
                let mut w = lock(writing);
                // Done: the writer may queue the next periodic sync.
                if data {
                    w.sync_pending = false;
                }
                if let Err(e) = r {
                    w.fail(&e);
                }
            }
        }
    }
}

/// One job's three steps (see `crate::spool::durable`); the spool's lock is held only to
/// read the state to write and to move the durable end.
fn do_job(writing: &Mutex<Writing>, job: Durability) -> Result<(), SpoolError> {
    let (dir, seg, state_file, metrics, failed) = {
        let w = lock(writing);
        let s = &w.spool;
        (
            s.dir().to_path_buf(),
            s.segment_size(),
            s.state_file(),
            w.publish.metrics.clone(),
            w.is_failed(),
        )
    };
    if failed {
        return Ok(());
    }
    let g = &metrics.ops.spool;
    let data = job.is_data();
    let (tli, end) = timed_wall(&g.sync_ns, || job.perform(&dir, seg))?;
    if data {
        g.syncs.fetch_add(1, Relaxed);
    }
    let st = lock(writing).spool.state_at(tli, end)?;
    let Some(st) = st else {
        return Ok(());
    };
    timed_wall(&g.sync_ns, || state_file.write(&st))?;
    let mut w = lock(writing);
    w.spool.made_durable(tli, end, !data)?;
    w.published();
    Ok(())
}
