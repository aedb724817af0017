//! One WAN copy for every standby (issue #11), with the halves as separate processes and the
//! link counted: three standbys cost the link what one does; a standby started later catches
//! up from the spool, not over the link; a cut link ends no standby's session; synchronous
//! replication over several standbys behind one downstream acknowledges as PostgreSQL says.
#![deny(clippy::undocumented_unsafe_blocks)]

mod common;

use common::split::{pause, Split, SplitOpts};
use common::*;
use walrelay_harness::cluster::{free_port, wait_until, Cluster, StandbyOpts, TempRoot};

/// Runs `transactions` pgbench transactions per client (4 clients) and returns (WAL bytes the
/// primary wrote, link bytes) over them, the standbys caught up.
async fn load(env: &Split, transactions: u32) -> (u64, u64) {
    for i in 0..env.standbys.len() {
        env.wait_caught_up(i).await;
    }
    let (lsn0, link0) = (env.lsn().await, env.link_bytes());
    pgbench(
        &env.primary,
        &["-c", "4", "-t", &transactions.to_string(), "-n", "postgres"],
    );
    for i in 0..env.standbys.len() {
        env.wait_caught_up(i).await;
    }
    (env.lsn().await - lsn0, env.link_bytes() - link0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_standbys_cost_the_link_what_one_does() {
    let mut env = Split::new(SplitOpts::default()).await;
    env.add_standby("dc2_a");
    env.standbys[0].start().await.unwrap();
    env.wait_streaming(0).await;
    pgbench(&env.primary, &["-i", "-s", "3", "-q", "postgres"]);
    let (wal1, link1) = load(&env, 1500).await;

    for name in ["dc2_b", "dc2_c"] {
        let i = env.add_standby(name);
        env.standbys[i].start().await.unwrap();
        env.wait_streaming(i).await;
    }
    let (wal3, link3) = load(&env, 1500).await;
    let (per1, per3) = (link1 as f64 / wal1 as f64, link3 as f64 / wal3 as f64);
    assert!(
        per3 <= 1.1 * per1,
        "three standbys: {link3} link bytes for {wal3} WAL bytes ({per3:.4}); one: {link1} for {wal1} ({per1:.4})"
    );
    assert_eq!(env.walsenders().await, "dc2_a,dc2_b,dc2_c,walrelay");
    for n in env.assert_all_identical().await {
        assert!(n >= 1, "no complete segment compared");
    }
    env.downstream.assert_no_panic();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_standby_catches_up_from_the_spool() {
    let mut env = Split::new(SplitOpts::default()).await;
    env.add_standby("early");
    env.standbys[0].start().await.unwrap();
    env.wait_streaming(0).await;
    pgbench(&env.primary, &["-i", "-s", "3", "-q", "postgres"]);
    // A base backup in the middle of a load; the load goes on after it.
    let load = pgbench_background(&env.primary, &["-c", "4", "-T", "12", "-n", "postgres"]);
    pause(3).await;
    let late = env.add_standby("late");
    // The late standby starts from its backup's end at the latest.
    let from = env.lsn().await;
    let _ = load.wait_with_output();
    // WAL after the backup that does not depend on how fast pgbench ran on a loaded machine.
    env.primary
        .execute(
            "create table filler as select g, md5(g::text) as t from generate_series(1, 200000) g",
        )
        .await
        .unwrap();
    env.wait_caught_up(0).await;

    // Everything the late standby replays is in the spool already: the link carries only its
    // channel (open, start, feedback).
    let link0 = env.link_bytes();
    env.standbys[late].start().await.unwrap();
    env.wait_streaming(late).await;
    env.wait_caught_up(late).await;
    let replayed = env.lsn().await - from.min(env.lsn().await);
    let link = env.link_bytes() - link0;
    assert!(
        replayed > 8 << 20,
        "the late standby replayed only {replayed} bytes"
    );
    assert!(
        (link as f64) <= 0.02 * replayed as f64,
        "the link carried {link} bytes while the late standby replayed {replayed} from the spool"
    );
    env.assert_all_identical().await;
}

/// A standby more than the upstream's `limits.max_sessions` allows is refused on its own,
/// with the limit named in its log; the link stream and the standby already served go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_past_the_upstreams_max_sessions_is_refused_alone() {
    let mut env = Split::new(SplitOpts {
        upstream_limits: "max_sessions = 1".into(),
        ..Default::default()
    })
    .await;
    env.add_standby("served");
    env.standbys[0].start().await.unwrap();
    env.wait_streaming(0).await;
    let extra = env.add_standby("extra");
    env.standbys[extra].start().await.unwrap();
    let s = &env.standbys[extra];
    walrelay_harness::cluster::wait_until("the extra standby's refusal", TIMEOUT, || async move {
        Ok(s.log_tail(50).contains("limits.max_sessions (1)"))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", s.log_tail(30)));
    pgbench(&env.primary, &["-i", "-s", "1", "-q", "postgres"]);
    env.wait_caught_up(0).await;
    let opened = env
        .downstream
        .log_text()
        .matches("link stream open")
        .count();
    assert_eq!(opened, 1, "the link stream was opened {opened} times");
    // A tunnel past the limit: the client hears why, and so does the upstream's log.
    let conninfo = format!(
        "host=127.0.0.1 port={} user={STANDBY_USER} replication=database dbname=postgres",
        env.down_port
    );
    let sql = "CREATE_REPLICATION_SLOT refused LOGICAL pgoutput";
    let (ok, _, err) = psql_repl(&env.primary, &conninfo, STANDBY_PASSWORD, sql);
    assert!(!ok && err.contains("limits.max_sessions (1)"), "{err}");
    let log = env.upstream.log_text();
    assert!(
        log.contains("refused a tunnel from the downstream: the upstream has reached limits.max_sessions (1)"),
        "{log}"
    );
    env.downstream.assert_no_panic();
    env.upstream.assert_no_panic();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_link_ends_no_standby_session() {
    let mut env = Split::new(SplitOpts::default()).await;
    for name in ["a", "b"] {
        let i = env.add_standby(name);
        env.standbys[i].start().await.unwrap();
        env.wait_streaming(i).await;
    }
    pgbench(&env.primary, &["-i", "-s", "3", "-q", "postgres"]);
    // The walreceivers to watch are the ones streaming once the initial load is replayed.
    env.wait_caught_up(0).await;
    env.wait_caught_up(1).await;
    let pid = |i: usize| {
        let s = &env.standbys[i];
        async move {
            s.query_one_string("select pid::text from pg_stat_wal_receiver")
                .await
                .unwrap()
        }
    };
    let before = (pid(0).await, pid(1).await);
    let dir = env.root.path().join("gone_b");
    let mut leaving = receivewal_streaming(&env.primary, &dir, env.down_port, "gone_b").await;
    let load = pgbench_background(&env.primary, &["-c", "4", "-T", "40", "-n", "postgres"]);
    pause(3).await;
    env.link.cut();
    // A session that streamed before the cut ends during it, and one comes and goes during
    // it: neither may come back as a connection to the primary when the link returns.
    let _ = leaving.kill();
    let _ = leaving.wait();
    let conninfo = format!(
        "host=127.0.0.1 port={} user={STANDBY_USER} replication=true application_name=gone_a",
        env.down_port
    );
    let _ = psql_repl(&env.primary, &conninfo, STANDBY_PASSWORD, "IDENTIFY_SYSTEM");
    pause(28).await;
    env.link.restore();
    let _ = load.wait_with_output();
    env.assert_all_identical().await;
    let names = "select string_agg(application_name, ',' order by application_name) from pg_stat_replication";
    assert_eq!(
        env.primary.query_one_string(names).await.unwrap(),
        "a,b,walrelay",
        "sessions that ended during the cut came back on the primary"
    );
    assert_eq!(
        (pid(0).await, pid(1).await),
        before,
        "a walreceiver reconnected"
    );
    for s in &env.standbys {
        let log = std::fs::read_to_string(s.log_path()).unwrap_or_default();
        assert!(
            !log.lines()
                .any(|l| l.contains("FATAL") && l.contains("walrelay")),
            "a standby heard a FATAL from walrelay:\n{}",
            s.log_tail(30)
        );
    }
    assert!(env
        .downstream
        .log_text()
        .contains("link to the upstream lost"));
}

/// pg_receivewal asks `SHOW data_directory_mode` on every connection (`GetConnection`), before
/// IDENTIFY_SYSTEM: while the link is cut it still starts, and gets what is spooled, as a
/// standby does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_receivewal_starts_while_the_link_is_cut() {
    let env = Split::new(SplitOpts::default()).await;
    env.primary
        .execute("create table t as select generate_series(1, 100000) x")
        .await
        .unwrap();
    env.wait_spool_caught_up().await;
    env.link.cut();
    let ds = &env.downstream;
    wait_until(
        "the downstream to see the link down",
        TIMEOUT,
        || async move { Ok(ds.log_text().contains("link to the upstream lost")) },
    )
    .await
    .unwrap();
    let conninfo = format!(
        "host=127.0.0.1 port={} user={STANDBY_USER} application_name=offline",
        env.down_port
    );
    let repl = format!("{conninfo} replication=true");
    let (ok, out, err) = psql_repl(&env.primary, &repl, STANDBY_PASSWORD, "IDENTIFY_SYSTEM");
    assert!(ok, "IDENTIFY_SYSTEM while the link is cut: {err}");
    // Up to the start of the spool's last page: sent whole whatever the spool's end holds.
    let spooled = parse_lsn(out.trim().split('|').nth(2).unwrap());
    let end = spooled - spooled % 8192;
    assert!(
        end % (16 << 20) != 0,
        "the spool ends at a segment's first page"
    );
    let dir = env.root.path().join("offline");
    std::fs::create_dir_all(&dir).unwrap();
    let mut child = env
        .primary
        .command("pg_receivewal")
        .arg("-D")
        .arg(&dir)
        .args(["-d", &conninfo, "--no-loop", "--no-sync"])
        .arg(format!("--endpos={:X}/{:X}", end >> 32, end as u32))
        .env("PGPASSWORD", STANDBY_PASSWORD)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut status = None;
    for _ in 0..600 {
        status = child.try_wait().unwrap();
        if status.is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    if status.is_none() {
        let _ = child.kill();
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "pg_receivewal while the link is cut: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let partial = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .any(|e| e.file_name().to_string_lossy().ends_with(".partial"));
    assert!(partial, "pg_receivewal wrote nothing");
    env.downstream.assert_no_panic();
}

/// A client that replies only when asked (pg_receivewal `-s 0`, a walreceiver with
/// `wal_receiver_status_interval = 0`) catching up longer than `limits.standby_timeout_secs`:
/// it is asked for a reply at half of it while WAL is being sent, as PostgreSQL's walsender
/// asks (`WalSndKeepaliveIfNecessary` on every turn of its loop), and is not cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_replying_only_when_asked_is_asked_while_it_catches_up() {
    let env = Split::new(SplitOpts {
        downstream_limits: "standby_timeout_secs = 10".into(),
        ..Default::default()
    })
    .await;
    env.primary
        .execute("create table t as select generate_series(1, 3000000) x")
        .await
        .unwrap();
    env.wait_spool_caught_up().await;
    let conninfo = format!(
        "host=127.0.0.1 port={} user={STANDBY_USER} replication=true",
        env.down_port
    );
    let (ok, out, err) = psql_repl(&env.primary, &conninfo, STANDBY_PASSWORD, "IDENTIFY_SYSTEM");
    assert!(ok, "IDENTIFY_SYSTEM: {err}");
    let spooled = parse_lsn(out.trim().split('|').nth(2).unwrap());
    let end = spooled - spooled % 8192;
    // Started at a segment of the slot-less start below, 16 s of WAL at 4 MB/s.
    let line = walrelay_harness::forward::Forwarder::start(env.down_port).unwrap();
    line.limit_from_target(4 << 20);
    let start = (end - (64 << 20)) & !((16 << 20) - 1);
    assert!(start > 0, "too little WAL");
    let dir = env.root.path().join("slow");
    std::fs::create_dir_all(&dir).unwrap();
    // pg_receivewal starts at the segment after its newest file.
    let seg = walrelay_wal::segment::WalSegSize::DEFAULT;
    let before = seg.file_name(
        walrelay_wal::lsn::TimeLineId(1),
        seg.segment_of(walrelay_wal::lsn::Lsn(start)) - 1,
    );
    std::fs::write(dir.join(before), vec![0u8; 16 << 20]).unwrap();
    let out = env
        .primary
        .command("pg_receivewal")
        .arg("-D")
        .arg(&dir)
        .args([
            "-d",
            &format!("host=127.0.0.1 port={} user={STANDBY_USER}", line.port),
            "--no-loop",
            "--no-sync",
            "--status-interval=0",
        ])
        .arg(format!("--endpos={:X}/{:X}", end >> 32, end as u32))
        .env("PGPASSWORD", STANDBY_PASSWORD)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "pg_receivewal -s 0 catching up: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        env.downstream.log_text()
    );
    env.downstream.assert_no_panic();
}

/// `ANY 1 (a, b)`: with both walreceivers stopped a commit waits; when one resumes, it
/// returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_1_of_two_standbys_behind_one_downstream() {
    let mut env = Split::new(SplitOpts::default()).await;
    for name in ["a", "b"] {
        let i = env.add_standby(name);
        env.standbys[i].start().await.unwrap();
        env.wait_streaming(i).await;
    }
    let p = &env.primary;
    require_any_1_of_a_and_b(p).await;
    p.execute("create table t(x int)").await.unwrap();

    let receivers = stop_the_walreceivers(&env).await;
    let mut commit = commit_in_the_background(p);
    assert_the_commit_waits(p, &mut commit).await;
    // SAFETY: kill(2) takes plain integers; no memory is involved.
    unsafe { libc::kill(receivers[1], libc::SIGCONT) };
    let status = tokio::task::spawn_blocking(move || commit.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success());
    // SAFETY: as above.
    unsafe { libc::kill(receivers[0], libc::SIGCONT) };
    env.wait_caught_up(0).await;
}

/// Sets `synchronous_standby_names = 'ANY 1 (a, b)'` on `p` and waits until both standbys are
/// in the quorum.
async fn require_any_1_of_a_and_b(p: &Cluster) {
    p.execute("alter system set synchronous_standby_names = 'ANY 1 (a, b)'")
        .await
        .unwrap();
    p.execute("select pg_reload_conf()").await.unwrap();
    wait_until("both standbys in the quorum", TIMEOUT, || async move {
        Ok(p.query_one_string("select coalesce(string_agg(sync_state, ',' order by application_name), '') from pg_stat_replication where application_name in ('a', 'b')").await? == "quorum,quorum")
    })
    .await
    .unwrap();
}

/// Stops (SIGSTOP) every standby's walreceiver; returns their pids.
async fn stop_the_walreceivers(env: &Split) -> Vec<i32> {
    let receivers: Vec<i32> = {
        let mut v = Vec::new();
        for s in &env.standbys {
            v.push(
                s.query_one_string("select pid::text from pg_stat_wal_receiver")
                    .await
                    .unwrap()
                    .parse()
                    .unwrap(),
            );
        }
        v
    };
    for r in &receivers {
        // SAFETY: kill(2) takes plain integers; no memory is involved.
        unsafe { libc::kill(*r, libc::SIGSTOP) };
    }
    receivers
}

/// Starts psql inserting into `t` on `p`, a commit that waits for a synchronous standby.
fn commit_in_the_background(p: &Cluster) -> std::process::Child {
    p.command("psql")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &p.port().to_string(),
            "-U",
            "postgres",
            "-XAtc",
            "insert into t values (1)",
            "postgres",
        ])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

/// Checks that the `commit` waits on SyncRep and has not returned 3 s later.
async fn assert_the_commit_waits(p: &Cluster, commit: &mut std::process::Child) {
    // The commit is there, waiting for a synchronous standby.
    wait_until(
        "the commit waits for a synchronous standby",
        TIMEOUT,
        || async move {
            Ok(p.query_one_string(
                "select count(*)::text from pg_stat_activity where wait_event = 'SyncRep'",
            )
            .await?
                == "1")
        },
    )
    .await
    .unwrap();
    pause(3).await;
    assert_eq!(
        p.query_one_string(
            "select count(*)::text from pg_stat_activity where wait_event = 'SyncRep'"
        )
        .await
        .unwrap(),
        "1"
    );
    assert!(
        commit.try_wait().unwrap().is_none(),
        "the commit returned with both standbys stopped"
    );
}

/// No single point of failure: two upstreams, two downstreams (each its own spool and slot,
/// `downstream.upstream` listing both upstreams), a standby listing both downstreams in its
/// primary_conninfo. One upstream is killed, then one downstream: the standby streams on
/// through the survivors and ends byte-identical.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_of_each_half_killed() {
    let root = TempRoot::new().unwrap();
    let primary = replication_primary(&root).await;
    let ups = [free_port(), free_port()];
    let mut upstreams = start_upstreams(&root, &primary, ups);
    let downs = [free_port(), free_port()];
    let mut downstreams = start_downstreams(&root, ups, downs);
    let standby = start_a_standby_listing_both(&root, &primary, downs).await;
    pgbench(&primary, &["-i", "-s", "2", "-q", "postgres"]);
    let load = pgbench_background(&primary, &["-c", "2", "-T", "16", "-n", "postgres"]);
    let s = &standby;
    wait_streaming_via(s, downs[0]).await;
    pause(3).await;
    upstreams[0].kill();
    pause(3).await;
    downstreams[0].kill();
    wait_streaming_via(s, downs[1]).await;
    let _ = load.wait_with_output();
    wait_caught_up_past_a_new_segment(&primary, s, &downstreams[1]).await;
    assert_standby_identical(&primary, &standby).await;
    drop(upstreams);
    drop(downstreams);
}

/// Starts an upstream for `primary` on each port of `ups`.
fn start_upstreams(root: &TempRoot, primary: &Cluster, ups: [u16; 2]) -> Vec<Relay> {
    ups.iter()
        .enumerate()
        .map(|(i, up)| {
            Relay::start(
                root.path(),
                &format!("upstream{i}"),
                &format!(
                    "[upstream]\nprimary = \"host=127.0.0.1 port={} user={STANDBY_USER} password={REPL_PASSWORD} sslmode=disable\"\nlisten = \"127.0.0.1:{up}\"\n\n[link]\nplaintext = true\nkeepalive_secs = 2\n",
                    primary.port()
                ),
                None,
                Some(*up),
            )
        })
        .collect()
}

/// Starts a downstream on each port of `downs`, each with its own spool and name, each
/// listing both upstreams `ups`.
fn start_downstreams(root: &TempRoot, ups: [u16; 2], downs: [u16; 2]) -> Vec<Relay> {
    downs
        .iter()
        .enumerate()
        .map(|(i, down)| {
            Relay::start(
                root.path(),
                &format!("downstream{i}"),
                &format!(
                    "[downstream]\nlisten = \"127.0.0.1:{down}\"\nupstream = [\"127.0.0.1:{}\", \"127.0.0.1:{}\"]\nauth = \"scram-sha-256\"\nusers = {{ {STANDBY_USER} = \"{}\" }}\nspool_dir = \"{}\"\nname = \"d{i}\"\n\n[link]\nplaintext = true\nkeepalive_secs = 2\nconnect_timeout_secs = 3\n",
                    ups[0],
                    ups[1],
                    walrelay_pgwire::scram::new_verifier(STANDBY_PASSWORD),
                    root.path().join(format!("spool{i}")).display(),
                ),
                Some(*down),
                None,
            )
        })
        .collect()
}

/// Makes and starts a standby (application_name `ha`) whose primary_conninfo lists both
/// downstreams `downs`.
async fn start_a_standby_listing_both(
    root: &TempRoot,
    primary: &Cluster,
    downs: [u16; 2],
) -> Cluster {
    let mut o = StandbyOpts::new(format!(
        "host=127.0.0.1,127.0.0.1 port={},{} user={STANDBY_USER} password={STANDBY_PASSWORD} application_name=ha",
        downs[0], downs[1]
    ));
    o.application_name = Some("ha".into());
    let standby = primary.basebackup_standby(root, "standby", &o).unwrap();
    standby.start().await.unwrap();
    standby
}

/// Waits until the standby `s` streams through the downstream on `port`.
async fn wait_streaming_via(s: &Cluster, port: u16) {
    wait_until(&format!("the standby streams through {port}"), TIMEOUT, || async move {
        Ok(s.query_one_string("select coalesce((select status || ':' || sender_port from pg_stat_wal_receiver), '')").await? == format!("streaming:{port}"))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", s.log_tail(30)));
}

/// Switches `primary` to a new segment, writes into it, and waits until the standby `s` has
/// replayed it (through the surviving downstream `survivor`).
async fn wait_caught_up_past_a_new_segment(primary: &Cluster, s: &Cluster, survivor: &Relay) {
    primary.execute("select pg_switch_wal()").await.unwrap();
    primary.execute("create table after(x int)").await.unwrap();
    let target = primary
        .query_one_string("select pg_current_wal_flush_lsn()::text")
        .await
        .unwrap();
    let t = target.clone();
    wait_until("the standby caught up", TIMEOUT, || {
        let t = t.clone();
        async move {
            Ok(s.query_one_string(&format!(
                "select (pg_last_wal_replay_lsn() >= '{t}'::pg_lsn)::text"
            ))
            .await?
                == "true")
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}\n{}", s.log_tail(30), survivor.log_text()));
}

/// Checks that the standby's pgbench tables and complete WAL segments match the primary's.
async fn assert_standby_identical(primary: &Cluster, standby: &Cluster) {
    assert_eq!(
        tables_digest(primary, PGBENCH_TABLES).await,
        tables_digest(standby, PGBENCH_TABLES).await
    );
    let received = standby
        .query_one_string("select flushed_lsn::text from pg_stat_wal_receiver")
        .await
        .unwrap();
    assert!(
        compare_segments(
            &primary.wal_dir(),
            &standby.wal_dir(),
            &segment_name(1, parse_lsn(&received))
        ) >= 1
    );
}
