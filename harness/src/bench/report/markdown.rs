//! The report as markdown: a table per window, the relays' waits, the codec, the replays,
//! the resource managers and the sync latency, in the order [`Report::markdown`] prints them.

use super::*;
use crate::bench::sample::CodecCut;

/// Issue 12: CPU per GB of both of W's halves at most this times Z's.
const CPU_TARGET: f64 = 1.5;
/// Issue 12: W's replay lag at most this times the direct standby's.
const LAG_TARGET: f64 = 1.2;
/// A direct standby's largest replay lag below this is too small to divide by.
const SMALL_LAG_MB: u64 = 1;

/// W's CPU per GB over Z's, and W's largest replay lag over the direct standby's (None where
/// the divisor is zero, or the direct lag under [`SMALL_LAG_MB`]).
pub(super) fn target_ratios(w: &Window) -> (Option<f64>, Option<f64>) {
    let cpu = |p: &PairWindow| p.upstream_cpu_s_per_gb + p.downstream_cpu_s_per_gb;
    let cpu = (cpu(&w.z) > 0.0).then(|| cpu(&w.w) / cpu(&w.z));
    let direct = w.direct_max_replay_lag_bytes;
    let lag =
        (direct >= SMALL_LAG_MB << 20).then(|| w.w.max_replay_lag_bytes as f64 / direct as f64);
    (cpu, lag)
}

fn mb(b: u64) -> f64 {
    b as f64 / 1e6
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.filter(|x| x.is_finite())
        .map(|x| format!("{x:.digits$}"))
        .unwrap_or_else(|| "-".into())
}

impl Report {
    /// Every table: one per window, the replay, the resource managers, the sync latency.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        if let Some(c) = &self.command {
            s.push_str(&format!("\nCommand: `{c}`\n"));
        }
        if let Some(b) = self.spool_bytes {
            s.push_str(&format!(
                "\nEach downstream's spool held at most {:.0} MiB of complete segments (--spool-bytes): \
                 once the run's WAL passed that, the spool was full and its oldest segments went \
                 as new ones came, as in a relay that has run for a while.\n",
                b as f64 / (1 << 20) as f64
            ));
        }
        if let Some(sites) = &self.sites {
            s.push_str(&format!("\n{}\n", sites.describe()));
        }
        if let Some(services) = &self.services {
            s.push_str(&format!("\n{services}\n"));
        }
        if self.w_share && self.services.is_some() {
            s.push_str(
                "\nPair W's relay processes ran with a larger CPU share (--w-share): their groups \
                 at three times the others' weight, as CPUWeight=300 beside 100. The primary's \
                 load got less of a busy CPU.\n",
            );
        } else if self.w_share {
            s.push_str(&format!(
                "\nPair W's relay processes ran with a larger CPU share (--w-share): their session \
                 groups and threads at nice {}, weight 3,121 against the 1,024 of each PostgreSQL \
                 process, as a CPU weight of their own (systemd's CPUWeight=) gives a service in \
                 production. The primary's load got less of a busy CPU.\n",
                super::super::background::FAVOURED
            ));
        }
        if self.z_background {
            s.push_str(
                "\nPair Z and its standby ran at nice 19 (--z-background): Z took a core only when W, \
                 the direct standby and the primary left one idle. Z's bytes are as in any run; \
                 its lags and cores are not comparable.\n",
            );
            if self.services.is_some() {
                s.push_str("They stayed out of the CPU groups of --services.\n");
            }
        }
        for (i, title) in [
            format!(
                "Cold: the first {} s after the relays start",
                self.cold_secs
            ),
            format!(
                "Steady: {} s measured after {} s of the same load",
                self.steady_secs,
                self.cold_secs + self.warmup_secs
            ),
        ]
        .iter()
        .enumerate()
        {
            s.push_str(&format!("\n{title}\n\n"));
            s.push_str(&self.window_table(i == 1));
        }
        s.push_str(&self.targets_table());
        s.push_str(&self.stage_table());
        s.push_str(&self.wait_table());
        s.push_str(&self.codec_table());
        s.push_str(&self.replay_table());
        s.push_str(&self.rmgr_table());
        s.push('\n');
        s.push_str(&self.sync_line());
        for k in &self.skipped {
            s.push_str(&format!("\nskipped: {k}\n"));
        }
        if !self.not_run.is_empty() {
            let why = match &self.stopped {
                Some(e) => format!("the bench stopped: {e}"),
                None => "still to run when this was written".into(),
            };
            s.push_str(&format!("\nnot run: {} ({why})\n", self.not_run.join(", ")));
        }
        s
    }

    fn window_table(&self, steady: bool) -> String {
        let mut s = String::from(
            "| workload | PG | tps | WAL MB | W link MB | W standby→primary | W / zstd-3 | W / zstd-19 --long | W / ssh -C | Z / zstd-3 | W msgs/s | W framing+feedback B/msg | of W link | CPU s/GB W up / down | CPU s/GB Z up / down | CPU s/GB direct standby's apply | cores W up / down | W runs staged ahead up / down; fast (times on) | max replay lag W / Z / direct MB | max receive lag W / Z / direct MB |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        let mut late = false;
        // The most payload in flight where W's framing was not estimated for it.
        let mut in_flight: Option<f64> = None;
        for r in &self.runs {
            let w = if steady { &r.steady } else { &r.cold };
            let (pw, pz) = (&w.w, &w.z);
            if !is_late(pw.receipt_delay_s) && pw.framing_feedback_bytes_per_message.is_none() {
                if let Some(b) = pw.framing_in_flight_bytes {
                    in_flight = Some(in_flight.map_or(b, |m: f64| m.max(b)));
                }
            }
            let mut mark = |p: &PairWindow| {
                let l = is_late(p.receipt_delay_s);
                late |= l;
                if l {
                    " †"
                } else {
                    ""
                }
            };
            let (mw, mz) = (mark(pw), mark(pz));
            s.push_str(&format!(
                "| {} | {} | {} | {:.1} | {:.2}{mw} | {:.1} % | {:.2} | {:.2} | {:.2} | {:.2}{mz} | {} | {} | {} % | {:.1} / {:.1} | {:.1} / {:.1} | {} | {:.2} / {:.2} | {} / {}; {} ({}) | {:.1} / {:.1} / {:.1} | {:.1} / {:.1} / {:.1} |\n",
                r.workload.name(),
                r.pg_major,
                opt(r.tps, 0),
                mb(w.wal_bytes),
                mb(pw.link_bytes),
                pw.toward_primary_share * 100.0,
                pw.vs_zstd3,
                pw.vs_zstd19_long,
                pw.vs_ssh_c,
                pz.vs_zstd3,
                opt(pw.messages_per_s, 0),
                opt(pw.framing_feedback_bytes_per_message, 1),
                opt(pw.framing_feedback_share.map(|x| x * 100.0), 1),
                pw.upstream_cpu_s_per_gb,
                pw.downstream_cpu_s_per_gb,
                pz.upstream_cpu_s_per_gb,
                pz.downstream_cpu_s_per_gb,
                opt(w.direct_apply_cpu_s_per_gb, 1),
                pw.upstream_cores,
                pw.downstream_cores,
                opt(pw.upstream_staged, 0),
                opt(pw.downstream_staged, 0),
                opt(pw.upstream_fast, 0),
                opt(pw.upstream_fast_spells, 0),
                mb(pw.max_replay_lag_bytes),
                mb(pz.max_replay_lag_bytes),
                mb(w.direct_max_replay_lag_bytes),
                mb(pw.max_receive_lag_bytes),
                mb(pz.max_receive_lag_bytes),
                mb(w.direct_max_receive_lag_bytes),
            ));
        }
        if let Some(b) = in_flight {
            s.push_str(&format!("\nW's framing + feedback not estimated (-) where the payload in flight between the upstream's count and the socket's at the window's ends (up to {:.2} MB) could be more than {:.0} % of the estimate: it would be charged as framing, or taken from it.\n", b / 1e6, FRAMING_TOLERANCE * 100.0));
        }
        if late {
            s.push_str(&format!("\n† approximate: that pair's standby received the window's WAL more than {LATE_SECS} s late, and link bytes in flight toward it are charged by its receipt; W's framing + feedback is then not estimated (-).\n"));
        }
        s
    }

    /// Per workload and window: the two ratios issue 12's targets are about, worked out here
    /// rather than by hand from figures rounded to one decimal.
    fn targets_table(&self) -> String {
        let mut s = format!(
            "\nTargets, per window: W's CPU per GB (both halves) / Z's (both halves), at most \
             {CPU_TARGET}; W's largest replay lag / the direct standby's, at most {LAG_TARGET} \
             (— where the direct standby's stayed under {SMALL_LAG_MB} MB: too small to \
             compare)\n\n| workload | PG | window | CPU per GB W / Z | max replay lag W / direct |\n|---|---:|---|---:|---:|\n"
        );
        for r in &self.runs {
            for (name, w) in [("cold", &r.cold), ("steady", &r.steady)] {
                let (cpu, lag) = target_ratios(w);
                let shown = |v: Option<f64>, target: f64| match v {
                    Some(v) if v <= target => format!("{v:.2}"),
                    Some(v) => format!("{v:.2} (misses)"),
                    None => "—".into(),
                };
                s.push_str(&format!(
                    "| {} | {} | {name} | {} | {} |\n",
                    r.workload.name(),
                    r.pg_major,
                    shown(cpu, CPU_TARGET),
                    shown(lag, LAG_TARGET)
                ));
            }
        }
        s
    }

    /// Per workload and window: how short of CPU the machine and each relay half were.
    fn wait_table(&self) -> String {
        let mut s = String::from(
            "\nWaiting for a core: the share of each window during which some runnable task on the machine waited for one (CPU pressure, /proc/pressure/cpu), and per relay half the cores it ran beside the cores' worth of time its threads were runnable but waited (schedstat). A half whose threads wait longer than they run is short of CPU, not slow at its work. Kernel: of each half's CPU time, the share spent in the kernel (/proc/<pid>/stat): system calls, and the pages of memory a process touches for the first time, which the kernel zeroes (W's caches as they fill; on a virtual machine whose host backs guest memory lazily, far slower than the memory's speed). Memory: each half's largest resident set up to the window's end (VmHWM, MB); W's halves each hold a block cache of up to `link.block_cache_bytes` (1 GiB here), filled as blocks are imaged, and a tuple cache of an eighth of it.\n\n| workload | PG | window | CPU pressure | W up ran / waited | W down ran / waited | Z up ran / waited | Z down ran / waited | kernel % W up / down | kernel % Z up / down | peak MB W up / down | peak MB Z up / down |\n|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        let half = |ran: f64, waited: Option<f64>| format!("{ran:.2} / {}", opt(waited, 2));
        let kernel = |p: &PairWindow| {
            let (up, down) = (p.upstream_kernel_share, p.downstream_kernel_share);
            format!("{:.0} / {:.0}", up * 100.0, down * 100.0)
        };
        let mb = |p: &PairWindow| {
            let m = |b: Option<f64>| opt(b.map(|b| b / 1e6), 0);
            format!("{} / {}", m(p.raw.peak_rss_up), m(p.raw.peak_rss_down))
        };
        for r in &self.runs {
            for w in [&r.cold, &r.steady] {
                s.push_str(&format!(
                    "| {} | {} | {} | {} % | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                    r.workload.name(),
                    r.pg_major,
                    w.name,
                    opt(w.cpu_pressure.map(|p| p * 100.0), 0),
                    half(w.w.upstream_cores, w.w.upstream_waiting_cores),
                    half(w.w.downstream_cores, w.w.downstream_waiting_cores),
                    half(w.z.upstream_cores, w.z.upstream_waiting_cores),
                    half(w.z.downstream_cores, w.z.downstream_waiting_cores),
                    kernel(&w.w),
                    kernel(&w.z),
                    mb(&w.w),
                    mb(&w.z),
                ));
            }
        }
        s
    }

    /// Per workload and window: what W's upstream codec did with records a link message's
    /// end cut, and with images.
    fn codec_table(&self) -> String {
        let mut s = String::from(
            "\nW's codec over each window (the upstream's counters): records a link message's end cut (passed raw in two pieces) and records held back whole for the next message instead; images through the block cache and of those, cache hits\n\n| workload | PG | window | records cut | records held | images | cache hits |\n|---|---:|---|---:|---:|---:|---:|\n",
        );
        for r in &self.runs {
            for w in [&r.cold, &r.steady] {
                let c = w.w.raw.codec;
                let f = |v: fn(&CodecCut) -> f64| opt(c.as_ref().map(v), 0);
                s.push_str(&format!(
                    "| {} | {} | {} | {} | {} | {} | {} |\n",
                    r.workload.name(),
                    r.pg_major,
                    w.name,
                    f(|c| c.records_cut),
                    f(|c| c.records_held),
                    f(|c| c.fpis),
                    f(|c| c.fpi_cache_hits),
                ));
            }
        }
        s
    }

    /// Per workload and window: the largest lag behind the primary's write position at each
    /// stage of each path (see [`super::stages`]); where a path's lag grows is where it waits.
    fn stage_table(&self) -> String {
        let mut s = String::from(
            "\nLag along each path: the largest MB behind the primary's write position over the window, at each stage the WAL passes (W: primary sent → upstream sent down → spooled → sent to standby → received → replayed)\n\n| workload | PG | window | primary flushed | direct: sent / received / replayed | Z: sent / received / replayed | W: sent / sent down / spooled / to standby / received / replayed | mean replay lag W / Z / direct MB |\n|---|---:|---|---:|---:|---:|---:|---:|\n",
        );
        let om = |v: Option<u64>| opt(v.map(mb), 1);
        let path = |p: &PathLags| {
            format!(
                "{} / {:.1} / {:.1}",
                om(p.primary_sent),
                mb(p.received),
                mb(p.replayed)
            )
        };
        for r in &self.runs {
            for w in [&r.cold, &r.steady] {
                let l = &w.stages;
                s.push_str(&format!(
                    "| {} | {} | {} | {:.1} | {} | {} | {} / {} / {} / {} / {:.1} / {:.1} | {:.1} / {:.1} / {:.1} |\n",
                    r.workload.name(),
                    r.pg_major,
                    w.name,
                    mb(l.flushed),
                    path(&l.direct),
                    path(&l.z),
                    om(l.w.primary_sent),
                    om(l.w_sent_down),
                    om(l.w_spooled),
                    om(l.w_sent_to_standby),
                    mb(l.w.received),
                    mb(l.w.replayed),
                    mb(l.w.mean_replayed),
                    mb(l.z.mean_replayed),
                    mb(l.direct.mean_replayed),
                ));
            }
        }
        s.push_str("\nMean replay lag over each third of the load, W / Z / direct MB (rising thirds: a lag that grows)\n\n| workload | PG | thirds |\n|---|---:|---|\n");
        for r in &self.runs {
            let parts: Vec<String> = r
                .lag_over_run
                .iter()
                .map(|p| {
                    format!(
                        "{:.0}–{:.0} s: {:.1} / {:.1} / {:.1}",
                        p.t_start,
                        p.t_end,
                        mb(p.w),
                        mb(p.z),
                        mb(p.direct)
                    )
                })
                .collect();
            s.push_str(&format!(
                "| {} | {} | {} |\n",
                r.workload.name(),
                r.pg_major,
                parts.join("; ")
            ));
        }
        s
    }

    fn replay_table(&self) -> String {
        let head = "| workload | PG | WAL MB | walrelay encode / decode | of it in the kernel, encode / decode | walrelay staged, wall encode / decode | zstd-1 encode / decode | zstd-3 encode / decode | ssh -C encode / decode | walrelay / zstd-3 bytes | walrelay / ssh -C bytes |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
        let cold: Pick = |r| {
            let row = r.replay.as_ref();
            let row = row.map(|m| {
                let passes = [&m.walrelay, &m.walrelay_staged, &m.zstd1, &m.zstd3];
                (m.wal_bytes, passes, &m.ssh_c)
            });
            (row, r.replay_error.as_deref())
        };
        let warm: Pick = |r| {
            let row = r.warm_replay.as_ref();
            let row = row.map(|m| {
                let passes = [&m.walrelay, &m.walrelay_staged, &m.zstd1, &m.zstd3];
                (m.wal_bytes, passes, &m.ssh_c)
            });
            (row, r.warm_replay_error.as_deref())
        };
        let tables = [
            ("Replay of the cold window's WAL on one core, fresh codecs (256 kB messages; MB/s per CPU-second; walrelay staged: more than one core allowed, each message staged while the one before is finished, as the relay's stages do while behind, MB/s per second of wall-clock time; in the kernel: the share of walrelay's one-core CPU time the kernel spent giving its growing caches memory not touched before, page faults that a virtual machine whose host backs memory lazily makes slow; ssh -C: zlib level 6 in full 32 kB packets with their framing, as OpenSSH compresses a forwarded stream, a best case for it)", cold),
            ("Replay of the steady window's WAL, the codecs warmed first on the WAL before it (up to 1 GiB, untimed): a relay that has been running", warm),
        ];
        let mut s = String::new();
        for (title, pick) in tables {
            s.push_str(&format!("\n{title}\n\n{head}"));
            for r in &self.runs {
                let (row, error) = pick(r);
                s.push_str(&replay_row(r, row, error));
            }
        }
        s
    }

    /// Per workload and resource manager: bytes in and out of the WAL-aware codec in the
    /// replay, largest first.
    fn rmgr_table(&self) -> String {
        let mut s = String::from(
            "\n| workload | PG | resource manager | records | WAL MB in | codec MB out | out / in |\n|---|---:|---|---:|---:|---:|---:|\n",
        );
        for r in &self.runs {
            let Some(m) = &r.replay else { continue };
            let name = r.workload.name();
            for x in m.by_rmgr.iter().filter(|x| x.bytes_in >= 1 << 16) {
                s.push_str(&format!(
                    "| {name} | {} | {} | {} | {:.2} | {:.3} | {:.3} |\n",
                    r.pg_major,
                    x.rmgr,
                    x.records,
                    mb(x.bytes_in),
                    mb(x.bytes_out),
                    ratio(x.bytes_out as f64, x.bytes_in as f64),
                ));
            }
            if m.tuple_deltas + m.tuple_misses > 0 {
                s.push_str(&format!(
                    "| {name} | {} | (heap tuples as deltas) | {} of {} | | {:.2} MB saved | |\n",
                    r.pg_major,
                    m.tuple_deltas,
                    m.tuple_deltas + m.tuple_misses,
                    mb(m.tuple_delta_saved),
                ));
            }
        }
        s
    }

    fn sync_line(&self) -> String {
        match &self.sync_latency {
            None => "Sync-commit latency: not measured (it runs with the pgbench workload).\n".into(),
            Some(l) => format!(
                "Sync-commit latency (pgbench -N -c 1, {} s, PG {}): through walrelay p50 {:.3} ms, p95 {:.3} ms ({} tx); direct standby p50 {:.3} ms, p95 {:.3} ms ({} tx); added by walrelay p50 {:+.3} ms, p95 {:+.3} ms.\n",
                l.seconds,
                l.pg_major,
                l.through_walrelay.p50_ms,
                l.through_walrelay.p95_ms,
                l.through_walrelay.transactions,
                l.direct.p50_ms,
                l.direct.p95_ms,
                l.direct.transactions,
                l.added_p50_ms,
                l.added_p95_ms,
            ),
        }
    }
}

/// A replay's row of a run: WAL bytes, the walrelay (one core, staged), zstd-1 and zstd-3
/// passes and the `ssh -C` one; or why not.
type ReplayRow<'a> = (u64, [&'a Pass; 4], &'a Pass);
type Pick = for<'a> fn(&'a RunResult) -> (Option<ReplayRow<'a>>, Option<&'a str>);

/// One row of a replay table: WAL bytes and the passes of walrelay (one core, staged), zstd-1,
/// zstd-3 and `ssh -C`, or the error that left the replay out.
fn replay_row(r: &RunResult, row: Option<ReplayRow>, error: Option<&str>) -> String {
    let (name, pg) = (r.workload.name(), r.pg_major);
    let Some((bytes, [w, staged, z1, z3], ssh)) = row else {
        return format!(
            "| {name} | {pg} | {} | | | | | | | | |\n",
            error.unwrap_or("-")
        );
    };
    let p = |x: &Pass| format!("{:.0} / {:.0}", x.encode_mb_s, x.decode_mb_s);
    let vs = |x: &Pass| ratio(w.encoded_bytes as f64, x.encoded_bytes as f64);
    format!(
        "| {name} | {pg} | {:.1} | {} | {:.0} / {:.0} % | {:.0} / {:.0} | {} | {} | {} | {:.2} | {:.2} |\n",
        mb(bytes),
        p(w),
        w.encode_kernel_share * 100.0,
        w.decode_kernel_share * 100.0,
        staged.encode_wall_mb_s,
        staged.decode_wall_mb_s,
        p(z1),
        p(z3),
        p(ssh),
        vs(z3),
        vs(ssh),
    )
}
