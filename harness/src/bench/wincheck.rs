//! Each window's WAL checked byte for byte: copied out of the primary's `pg_wal` as soon as
//! the window is sampled (the primary has written its end), then compared with each
//! standby's as soon as that standby received its end.
//!
//! Neither step waits for the slowest standby, because under `--z-background` on `bulk` pair
//! Z's standby (at nice 19) can receive a window's end minutes after the others, and by then:
//! - the primary may have written more than its `wal_keep_size` past the window and removed
//!   its first segments (a run on PostgreSQL 18 failed so, 2026-12-05, when the copy waited
//!   for both standbys);
//! - the other standby may have removed them after a restartpoint (the next run failed so,
//!   when the comparison waited for both).

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Result;
use futures::future::{BoxFuture, FutureExt, Shared};
use tokio::task::JoinHandle;

use super::sample::{self, Sample};
use super::walrange;

/// The copy of a window's WAL from the primary, awaited by each standby's comparison.
type Copy = Shared<BoxFuture<'static, Result<(), Arc<anyhow::Error>>>>;

/// Where one window's check is.
pub enum WindowCheck {
    /// Not sampled to its end yet.
    Waiting,
    /// Its WAL [from, to) copied from the primary (or being copied), and compared with each
    /// standby that received its end (or being compared): `compares[i]` for standby `i`.
    Checking {
        from: u64,
        to: u64,
        copy: Copy,
        compares: [Option<JoinHandle<Result<()>>>; 2],
    },
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
    /// The check after a new sample: the copy starts once the samples reach `t1`, each
    /// standby's comparison once that standby received the window's end. The flag is true
    /// when the last comparison started with this call.
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
                let copy = async move {
                    match copy.await {
                        Ok(r) => r.map_err(Arc::new),
                        Err(e) => Err(Arc::new(e.into())),
                    }
                };
                let check = WindowCheck::Checking {
                    from,
                    to,
                    copy: copy.boxed().shared(),
                    compares: [None, None],
                };
                // A window whose end both standbys have already received.
                check.advance(samples, t0, t1, dirs)
            }
            WindowCheck::Checking {
                from,
                to,
                copy,
                mut compares,
            } => {
                let Some(last) = samples.last() else {
                    return (
                        WindowCheck::Checking {
                            from,
                            to,
                            copy,
                            compares,
                        },
                        false,
                    );
                };
                let mut started = false;
                for (i, compare) in compares.iter_mut().enumerate() {
                    if compare.is_none() && last.received[i] >= to {
                        let (copy, file) = (copy.clone(), dirs.file.clone());
                        let standby = dirs.standbys[i].clone();
                        *compare = Some(tokio::spawn(async move {
                            copy.await.map_err(|e| anyhow::anyhow!("{e:#}"))?;
                            compare_blocking(file, standby, from, to).await
                        }));
                        started = true;
                    }
                }
                let check = WindowCheck::Checking {
                    from,
                    to,
                    copy,
                    compares,
                };
                let all = check.comparing();
                (check, started && all)
            }
        }
    }

    /// Whether every standby's comparison has started.
    pub fn comparing(&self) -> bool {
        matches!(self, WindowCheck::Checking { compares, .. } if compares.iter().all(Option::is_some))
    }

    /// The bytes compared per standby, once every comparison is over; an error when one
    /// failed or never started.
    pub async fn finish(self) -> Result<u64> {
        let WindowCheck::Checking {
            from,
            to,
            compares: [Some(a), Some(b)],
            ..
        } = self
        else {
            anyhow::bail!("the window's WAL was never compared with both standbys'");
        };
        a.await??;
        b.await??;
        Ok(to - from)
    }
}

/// Compares `file` (the primary's [from, to)) with `standby`'s `pg_wal`, off the runtime.
async fn compare_blocking(file: PathBuf, standby: PathBuf, from: u64, to: u64) -> Result<()> {
    tokio::task::spawn_blocking(move || walrange::compare_range(&file, &standby, from, to)).await?
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
            direct_apply: None,
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
    /// `wal_keep_size` would) and the first standby's (as its restartpoints would) once it was
    /// compared, then feeds `later`: the result, and after which sample the last comparison
    /// started.
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
                let WindowCheck::Checking { copy, compares, .. } = &c else {
                    panic!("the window was sampled to its end: the copy must have started");
                };
                // Let the copy and the first standby's comparison finish before the segments go.
                copy.clone().await.unwrap();
                let first = compares[0]
                    .as_ref()
                    .expect("the first standby has the window");
                while !first.is_finished() {
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                }
                std::fs::remove_dir_all(primary.path()).unwrap();
                std::fs::remove_dir_all(a.path()).unwrap();
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
    async fn the_window_is_copied_before_the_standbys_have_it_and_compared_with_each_as_it_does() {
        let (from, to) = (WAL_SEGMENT_SIZE + 100, WAL_SEGMENT_SIZE + 5000);
        let samples = [sample(0.0, from, [from, 0]), sample(1.0, to, [to, from])];
        // The second standby receives the window's end only after the primary's segment and
        // the first standby's are gone.
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
