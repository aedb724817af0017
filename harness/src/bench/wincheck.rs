//! Each window's WAL checked byte for byte: copied out of the primary's `pg_wal` as soon as
//! the window is sampled (the primary has written its end), then compared with each
//! standby's once both received its end.
//!
//! The copy does not wait for the standbys: a standby far behind (pair Z's at nice 19 under
//! `--z-background`, on `bulk`) can receive a window's end after the primary has written more
//! than its `wal_keep_size` past it and removed the window's first segments. A run on
//! PostgreSQL 18 failed so (2026-12-05): segment 6 was gone when the standbys had both
//! received the cold window.

use std::path::PathBuf;

use anyhow::Result;
use tokio::task::JoinHandle;

use super::sample::{self, Sample};
use super::walrange;

/// Where one window's check is.
pub enum WindowCheck {
    /// Not sampled to its end yet.
    Waiting,
    /// Its WAL [from, to) being copied from the primary.
    Copying {
        from: u64,
        to: u64,
        copy: JoinHandle<Result<()>>,
    },
    /// Compared (or being compared) with both standbys: the bytes compared.
    Comparing(JoinHandle<Result<u64>>),
}

/// What a check reads and writes.
pub struct Dirs {
    /// The primary's `pg_wal`.
    pub primary: PathBuf,
    /// Both relayed standbys' `pg_wal`.
    pub standbys: [PathBuf; 2],
    /// The window's copy.
    pub file: PathBuf,
}

impl WindowCheck {
    /// The check after a new sample: the copy starts once the samples reach `t1`, the
    /// comparison once both standbys received the window's end. The flag is true when the
    /// comparison started with this call.
    pub fn advance(self, samples: &[Sample], t0: f64, t1: f64, dirs: &Dirs) -> (WindowCheck, bool) {
        match self {
            WindowCheck::Waiting => {
                let (Some(from), Some(to)) =
                    (sample::lsn_at(samples, t0), sample::lsn_at(samples, t1))
                else {
                    return (WindowCheck::Waiting, false);
                };
                let (primary, file) = (dirs.primary.clone(), dirs.file.clone());
                let copy = tokio::task::spawn_blocking(move || {
                    walrange::copy_range(&primary, from, to, &file)
                });
                (WindowCheck::Copying { from, to, copy }, false)
            }
            WindowCheck::Copying { from, to, copy } => {
                let received = samples
                    .last()
                    .is_some_and(|s| s.received.iter().all(|&r| r >= to));
                if !received {
                    return (WindowCheck::Copying { from, to, copy }, false);
                }
                let (standbys, file) = (dirs.standbys.clone(), dirs.file.clone());
                let compare = tokio::spawn(async move {
                    copy.await??;
                    tokio::task::spawn_blocking(move || {
                        for s in &standbys {
                            walrange::compare_range(&file, s, from, to)?;
                        }
                        Ok(to - from)
                    })
                    .await?
                });
                (WindowCheck::Comparing(compare), true)
            }
            comparing => (comparing, false),
        }
    }

    /// Whether the comparison has started.
    pub fn comparing(&self) -> bool {
        matches!(self, WindowCheck::Comparing(_))
    }

    /// The bytes compared, once the comparison is over; an error when it failed or never
    /// started.
    pub async fn finish(self) -> Result<u64> {
        match self {
            WindowCheck::Comparing(task) => task.await?,
            _ => anyhow::bail!("the window's WAL was never compared with the standbys'"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::pair::PairCounters;
    use crate::bench::stages::PrimaryPositions;
    use crate::cluster::walrec::{segment_file_name, WAL_SEGMENT_SIZE};

    fn sample(t: f64, primary: u64, received: [u64; 2]) -> Sample {
        Sample {
            t,
            primary_lsn: primary,
            received,
            replayed: received,
            direct_received: primary,
            direct_replayed: primary,
            pairs: [PairCounters::default(); 2],
            primary: PrimaryPositions::default(),
            w_relay: None,
            cpu_pressure: 0.0,
        }
    }

    /// A `pg_wal` with segment 1 of `byte`s, one but the `odd`th byte (if any).
    fn pg_wal(byte: u8, odd: Option<usize>) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let mut seg = vec![byte; WAL_SEGMENT_SIZE as usize];
        if let Some(i) = odd {
            seg[i] ^= 0xff;
        }
        std::fs::write(dir.path().join(segment_file_name(1, 1)), seg).unwrap();
        dir
    }

    /// Runs the check over `samples`, then removes the primary's segment (as the primary's
    /// `wal_keep_size` would), then feeds `later`: the result, and after which sample the
    /// comparison started.
    async fn check(
        samples: &[Sample],
        later: &[Sample],
        odd: Option<usize>,
    ) -> (Result<u64>, Option<usize>) {
        let (primary, a, b, out) = (
            pg_wal(7, None),
            pg_wal(7, None),
            pg_wal(7, odd),
            tempfile::tempdir().unwrap(),
        );
        let dirs = Dirs {
            primary: primary.path().into(),
            standbys: [a.path().into(), b.path().into()],
            file: out.path().join("window.wal"),
        };
        let (from, to) = (WAL_SEGMENT_SIZE + 100, WAL_SEGMENT_SIZE + 5000);
        assert_eq!(
            (sample::lsn_at(samples, 0.0), sample::lsn_at(samples, 1.0)),
            (Some(from), Some(to))
        );
        let (mut c, mut started) = (WindowCheck::Waiting, None);
        let mut seen = Vec::new();
        for (i, s) in samples.iter().chain(later).enumerate() {
            if i == samples.len() {
                // Let the copy finish before the segment goes.
                if let WindowCheck::Copying { from, to, copy } = c {
                    copy.await.unwrap().unwrap();
                    c = WindowCheck::Copying {
                        from,
                        to,
                        copy: tokio::spawn(async { Ok(()) }),
                    };
                }
                std::fs::remove_dir_all(primary.path()).unwrap();
            }
            seen.push(s.clone());
            let (next, now) = c.advance(&seen, 0.0, 1.0, &dirs);
            c = next;
            if now {
                started = Some(i);
            }
        }
        (c.finish().await, started)
    }

    #[tokio::test]
    async fn the_window_is_copied_before_the_standbys_have_it_and_compared_once_both_do() {
        let (from, to) = (WAL_SEGMENT_SIZE + 100, WAL_SEGMENT_SIZE + 5000);
        let samples = [sample(0.0, from, [from, 0]), sample(1.0, to, [to, from])];
        // The second standby receives the window's end only after the primary's segment is gone.
        let later = [
            sample(2.0, to + 10, [to + 10, to - 1]),
            sample(3.0, to + 20, [to + 20, to]),
        ];
        let (res, started) = check(&samples, &later, None).await;
        assert_eq!(res.unwrap(), to - from);
        assert_eq!(started, Some(3));
        // A byte of the window that differs on a standby fails the check, naming its position.
        let (res, _) = check(&samples, &later, Some(200)).await;
        let e = res.unwrap_err().to_string();
        assert!(e.contains("differs") && e.contains("0/10000C8"), "{e}");
        // A window never received by both is an error, not 0 bytes compared.
        let (res, started) = check(&samples, &later[..1], None).await;
        assert!(res.is_err() && started.is_none());
    }
}
