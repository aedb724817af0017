//! The bench's run order, and what it keeps when a run stops early.
//!
//! A bench of several workloads runs for an hour or more. Each workload that finishes goes
//! into the report at once and the report so far is handed on (the CLI writes `--json`
//! then), so a later workload that fails, a full disk, a Ctrl-C or a killed process costs
//! only the workloads not yet finished. When a workload fails the run stops there: the report
//! keeps what finished, names what did not run and says why ([`Report::not_run`],
//! [`Report::stopped`]), and the error is returned beside it.

use std::future::Future;

use anyhow::Result;

use super::report::{Report, RunResult};
use super::synclat::SyncLatency;

/// One workload on one PostgreSQL major, as [`run_jobs`] sees it.
pub(super) trait Job {
    /// "bulk on PostgreSQL 15": how the report names it.
    fn label(&self) -> String;
}

/// Runs `jobs` in order with `one`, which is told whether the sync latency is still to be
/// measured. After each job that finished, `report` holds its result and `finished` sees the
/// report so far, with the jobs still to come in `not_run`. The first failure (of a job or
/// of `finished`) stops the run: `report.not_run` then names the failed job and those after
/// it, `report.stopped` says why, and the error is returned.
pub(super) async fn run_jobs<J, F, Fut>(
    report: &mut Report,
    jobs: Vec<J>,
    mut one: F,
    finished: &mut dyn FnMut(&Report) -> Result<()>,
) -> Result<()>
where
    J: Job,
    F: FnMut(J, bool) -> Fut,
    Fut: Future<Output = Result<(RunResult, Option<SyncLatency>)>>,
{
    let labels: Vec<String> = jobs.iter().map(Job::label).collect();
    for (i, job) in jobs.into_iter().enumerate() {
        report.not_run = labels[i + 1..].to_vec();
        let (kept, outcome) = match one(job, report.sync_latency.is_none()).await {
            Ok((r, lat)) => {
                report.runs.push(r);
                report.sync_latency = report.sync_latency.take().or(lat);
                (true, finished(report))
            }
            Err(e) => (false, Err(e)),
        };
        if let Err(e) = outcome {
            // A job whose result was kept before `finished` failed is not among the missing.
            report.not_run = labels[i + usize::from(kept)..].to_vec();
            report.stopped = Some(format!("{e:#}"));
            let not_run = match report.not_run.is_empty() {
                true => "none".to_string(),
                false => report.not_run.join(", "),
            };
            return Err(e.context(format!("the bench stopped; not run: {not_run}")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::report::Window;
    use super::super::workloads::Workload;
    use super::*;

    #[derive(Clone)]
    struct Named(&'static str);

    impl Job for Named {
        fn label(&self) -> String {
            self.0.into()
        }
    }

    fn empty() -> Report {
        Report {
            command: None,
            cold_secs: 1,
            warmup_secs: 0,
            steady_secs: 1,
            z_background: false,
            w_share: false,
            sites: None,
            services: None,
            spool_bytes: None,
            runs: Vec::new(),
            skipped: Vec::new(),
            not_run: Vec::new(),
            stopped: None,
            sync_latency: None,
        }
    }

    /// A result for `job`, or an error for the job named "fails".
    async fn outcome(job: Named) -> Result<(RunResult, Option<SyncLatency>)> {
        anyhow::ensure!(job.0 != "fails", "no room left on the disk");
        let windows = (Window::default(), Window::default());
        Ok((RunResult::bare(Workload::Updates, windows), None))
    }

    #[tokio::test]
    async fn a_failed_workload_keeps_the_ones_before_it_and_names_the_rest() {
        let mut report = empty();
        let mut seen = Vec::new();
        let jobs = ["toast", "fails", "bulk"].map(Named).to_vec();
        let e = run_jobs(&mut report, jobs, |j, _| outcome(j), &mut |r| {
            seen.push((r.runs.len(), r.not_run.clone()));
            Ok(())
        })
        .await
        .unwrap_err();
        // The report so far was handed on once, after the first workload, with the rest
        // still to come.
        assert_eq!(seen, vec![(1, vec!["fails".to_string(), "bulk".into()])]);
        assert_eq!(report.runs.len(), 1);
        assert_eq!(report.not_run, ["fails", "bulk"]);
        assert_eq!(report.stopped.as_deref(), Some("no room left on the disk"));
        let e = format!("{e:#}");
        assert!(e.contains("stopped; not run: fails, bulk"), "{e}");
        // The tables show what finished, then what did not run and why.
        let md = report.markdown();
        assert!(md.contains("| updates |"), "{md}");
        assert!(
            md.contains("not run: fails, bulk (the bench stopped: no room left on the disk)"),
            "{md}"
        );
    }

    #[tokio::test]
    async fn a_full_run_hands_on_each_workload_and_ends_with_nothing_left() {
        let mut report = empty();
        let mut seen = Vec::new();
        let jobs = ["toast", "bulk"].map(Named).to_vec();
        run_jobs(&mut report, jobs, |j, _| outcome(j), &mut |r| {
            seen.push(r.runs.len());
            Ok(())
        })
        .await
        .unwrap();
        assert_eq!(seen, [1, 2]);
        assert!(report.not_run.is_empty() && report.stopped.is_none());
    }

    #[tokio::test]
    async fn a_report_that_cannot_be_written_stops_the_run_but_keeps_the_result() {
        let mut report = empty();
        let jobs = ["toast", "bulk"].map(Named).to_vec();
        let e = run_jobs(&mut report, jobs, |j, _| outcome(j), &mut |_| {
            anyhow::bail!("writing bench.json: read-only file system")
        })
        .await
        .unwrap_err();
        assert_eq!(report.runs.len(), 1);
        assert_eq!(report.not_run, ["bulk"]);
        let e = format!("{e:#}");
        assert!(e.contains("stopped; not run: bulk"), "{e}");
        assert!(e.contains("read-only"), "{e}");
    }
}
