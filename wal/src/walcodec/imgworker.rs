//! A thread that compresses pages of images the primary compressed, for either end while it
//! goes on with the message ([`fpi`]): the encoder's checks (does compressing the page again
//! give the primary's bytes?) and the decoder's compressions (the image bytes a record
//! needs). Jobs and outcomes keep their order.
//!
//! Jobs go to the thread [`BATCH`] at a time (and the rest when an outcome is asked for): one
//! wake-up per image costs about as much as the work it moves. At most [`QUEUE`] batches
//! (a page copy and maybe the image's bytes each) wait for it; when they do, the thread is
//! behind and [`ImgWorker::submit`] declines the job, which the caller then does itself: the
//! work splits between the two threads by their speed (with pglz images the compression is
//! most of the decoder's work, more than the thread alone gets through while the caller
//! does the rest). Outcomes wait, unbounded, until taken: the caller takes every outcome of
//! a message at its end, so they are bounded by the images of one message.
//!
//! [`fpi`]: super::fpi

use std::collections::VecDeque;
use std::sync::mpsc;
use std::thread::JoinHandle;

use super::cache::{new_page, Page};
use super::fpi::{Method, Recompressor};
use super::wal::ImageRef;
use super::WalCodecError;

/// Jobs handed to the thread at once.
const BATCH: usize = 4;
/// Batches queued for the thread at most.
const QUEUE: usize = 4;

/// What to do with a page (an image of method `m`, geometry `img`).
pub enum Task {
    /// Whether compressing it gives these bytes (the encoder's check).
    Check(Vec<u8>),
    /// Compress it (the decoder's restoring).
    Compress,
}

struct Job {
    m: Method,
    img: ImageRef,
    page: Page,
    task: Task,
}

/// A job's outcome, in job order: for [`Task::Check`] the bytes back if they did not
/// reproduce (else `None`); for [`Task::Compress`] the compressed bytes (`None` where
/// PostgreSQL would not have kept them).
pub type Outcome = Option<Vec<u8>>;

pub struct ImgWorker {
    jobs: Option<mpsc::SyncSender<Vec<Job>>>,
    outcomes: mpsc::Receiver<Vec<Outcome>>,
    thread: Option<JoinHandle<()>>,
    /// Jobs not handed over yet, and outcomes received but not taken.
    batch: Vec<Job>,
    ready: VecDeque<Outcome>,
}

fn run(m: &mut Recompressor, j: Job) -> Outcome {
    match j.task {
        Task::Check(bytes) => (!m.reproduces(j.m, &j.img, &j.page, &bytes)).then_some(bytes),
        Task::Compress => {
            let mut out = Vec::new();
            m.compress(j.m, &j.img, &j.page, &mut out).then_some(out)
        }
    }
}

impl ImgWorker {
    pub fn start() -> Result<ImgWorker, WalCodecError> {
        let mut recomp = Recompressor::new().ok_or_else(|| {
            WalCodecError::Zstd("cannot create a zstd context for the image thread".into())
        })?;
        let (jobs, queue) = mpsc::sync_channel::<Vec<Job>>(QUEUE);
        let (done, outcomes) = mpsc::channel::<Vec<Outcome>>();
        let thread = std::thread::Builder::new()
            .name("walcodec-images".into())
            .spawn(move || {
                for batch in queue {
                    let out = batch.into_iter().map(|j| run(&mut recomp, j)).collect();
                    if done.send(out).is_err() {
                        return;
                    }
                }
            })
            .map_err(|e| WalCodecError::Zstd(format!("cannot start the image thread: {e}")))?;
        Ok(ImgWorker {
            jobs: Some(jobs),
            outcomes,
            thread: Some(thread),
            batch: Vec::with_capacity(BATCH),
            ready: VecDeque::new(),
        })
    }

    /// The worker in `slot`, started there if there is none yet.
    pub fn started(slot: &mut Option<ImgWorker>) -> Result<&mut ImgWorker, WalCodecError> {
        match slot {
            Some(w) => Ok(w),
            None => Ok(slot.insert(ImgWorker::start()?)),
        }
    }

    /// Queues the task `task()` makes for `page` (copied); `Ok(false)`, and nothing made or
    /// queued, when the thread is behind (the caller does the job itself).
    pub fn submit(
        &mut self,
        m: Method,
        img: &ImageRef,
        page: &Page,
        task: impl FnOnce() -> Task,
    ) -> Result<bool, WalCodecError> {
        if self.batch.len() >= BATCH && !self.try_hand_over()? {
            return Ok(false);
        }
        let mut copy = new_page();
        copy.copy_from_slice(&page[..]);
        self.batch.push(Job {
            m,
            img: *img,
            page: copy,
            task: task(),
        });
        if self.batch.len() >= BATCH {
            self.try_hand_over()?;
        }
        Ok(true)
    }

    /// Hands the full batch to the thread if its queue has room; false if not.
    fn try_hand_over(&mut self) -> Result<bool, WalCodecError> {
        let jobs = self.jobs.as_ref().ok_or_else(stopped)?;
        let batch = std::mem::take(&mut self.batch);
        match jobs.try_send(batch) {
            Ok(()) => {
                self.batch.reserve(BATCH);
                Ok(true)
            }
            Err(mpsc::TrySendError::Full(batch)) => {
                self.batch = batch;
                Ok(false)
            }
            Err(mpsc::TrySendError::Disconnected(_)) => Err(stopped()),
        }
    }

    /// Hands the jobs gathered so far to the thread.
    fn hand_over(&mut self) -> Result<(), WalCodecError> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let batch = std::mem::replace(&mut self.batch, Vec::with_capacity(BATCH));
        self.jobs
            .as_ref()
            .and_then(|j| j.send(batch).ok())
            .ok_or_else(stopped)
    }

    /// The outcome of the oldest job not taken yet (waits for it).
    pub fn next(&mut self) -> Result<Outcome, WalCodecError> {
        if self.ready.is_empty() {
            self.hand_over()?;
            let batch = self.outcomes.recv().map_err(|_| stopped())?;
            self.ready.extend(batch);
        }
        self.ready.pop_front().ok_or_else(stopped)
    }

    /// Takes and drops the outcomes of `n` jobs (a message that failed).
    pub fn drop_outcomes(&mut self, n: usize) {
        for _ in 0..n {
            if self.next().is_err() {
                break;
            }
        }
    }
}

fn stopped() -> WalCodecError {
    WalCodecError::Zstd("the image thread stopped".into())
}

impl Drop for ImgWorker {
    fn drop(&mut self) {
        // Closing the queue ends the thread after at most QUEUE batches.
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
