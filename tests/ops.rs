//! Operations, with the real binary: JSON logs, SIGHUP reload (users, limits, log level, the
//! primary's password; a broken file keeps the running config), SIGTERM/SIGINT drain with a bounded exit, also when
//! a standby stopped reading.
#![deny(clippy::undocumented_unsafe_blocks)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use walrelay_harness::cluster::{wait_until, Cluster, TempRoot};

/// The harness's drain_timeout_secs (see `both_halves_toml`) and the margin allowed on top.
const GRACE: Duration = Duration::from_secs(3);
const MARGIN: Duration = Duration::from_secs(10);

fn repl_conninfo(port: u16) -> String {
    format!("host=127.0.0.1 port={port} user={STANDBY_USER} replication=true sslmode=disable")
}

/// Waits until the relay's log has a line containing `needle`; returns that line.
fn wait_log(relay: &Relay, needle: &str) -> String {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        if let Some(l) = relay.log_text().lines().find(|l| l.contains(needle)) {
            return l.to_string();
        }
        assert!(
            Instant::now() < deadline,
            "no log line with {needle:?}:\n{}",
            relay.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Replaces the line of `toml` that starts with `prefix`.
fn set_line(toml: &str, prefix: &str, line: &str) -> String {
    let mut found = false;
    let out: Vec<String> = toml
        .lines()
        .map(|l| {
            if l.starts_with(prefix) {
                found = true;
                line.to_string()
            } else {
                l.to_string()
            }
        })
        .collect();
    assert!(found, "no line starting with {prefix:?} in:\n{toml}");
    out.join("\n") + "\n"
}

async fn walreceiver_pid(env: &Env) -> String {
    env.standby
        .query_one_string("select pid::text from pg_stat_wal_receiver")
        .await
        .unwrap()
}

/// The standby user's password after the reload.
const NEW_PASSWORD: &str = "rotated-secret";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_users_limits_and_log_level_and_json_logs_parse() {
    let env = env(EnvOpts {
        log_from_config: true,
        extra_toml: "[log]\nlevel = \"info\"\nformat = \"json\"\n".into(),
        ..Default::default()
    })
    .await;
    let conninfo = repl_conninfo(env.down_port);
    let (ok, _, err) = psql_repl(&env.primary, &conninfo, STANDBY_PASSWORD, "IDENTIFY_SYSTEM");
    assert!(ok, "{err}");
    let receiver = walreceiver_pid(&env).await;

    let toml = reload_with_new_users_level_and_limits(&env);
    assert_new_password_works_and_the_session_goes_on(&env, &conninfo, &receiver).await;

    let mut relay = env.relay;
    assert_broken_configs_are_not_reloaded(&relay, &toml).await;
    let (ok, _, err) = psql_repl(&env.primary, &conninfo, NEW_PASSWORD, "IDENTIFY_SYSTEM");
    assert!(ok, "a broken config on SIGHUP stopped serving: {err}");
    assert!(relay.is_running());

    let status = relay.terminate(GRACE + MARGIN);
    assert!(
        status.is_some_and(|s| s.success()),
        "exit after SIGTERM: {status:?}"
    );

    assert_json_logs_parse(&relay);
}

/// Writes a config with a new password, a debug log filter, a lower session limit and a
/// restart-only change, sends SIGHUP and checks what the relay reports; returns the config.
fn reload_with_new_users_level_and_limits(env: &Env) -> String {
    // New password for the standby user, a debug log filter, a lower session limit, and a
    // restart-only change (the codec).
    let old_toml = std::fs::read_to_string(&env.relay.config).unwrap();
    let mut toml = set_line(
        &old_toml,
        "users = ",
        &format!(
            "users = {{ {STANDBY_USER} = \"{}\" }}",
            walrelay_pgwire::scram::new_verifier(NEW_PASSWORD)
        ),
    );
    toml = set_line(&toml, "level = ", "level = \"walrelay=debug,info\"");
    toml = set_line(
        &toml,
        "drain_timeout_secs = ",
        "drain_timeout_secs = 3\nmax_sessions = 10",
    );
    toml = toml.replace("[link]\n", "[link]\ncodec = \"zstd\"\n");
    std::fs::write(&env.relay.config, &toml).unwrap();
    env.relay.signal(libc::SIGHUP);
    let reloaded = wait_log(&env.relay, "configuration reloaded");
    for key in ["downstream.users", "log.level", "limits.max_sessions"] {
        assert!(reloaded.contains(key), "{key} not reported: {reloaded}");
    }
    let restart = wait_log(&env.relay, "take effect only after a restart");
    assert!(restart.contains("link.codec"), "{restart}");
    assert!(!restart.contains("downstream.users"), "{restart}");
    toml
}

/// Checks that new connections need the new password while the standby's session (walreceiver
/// `receiver`) streams on.
async fn assert_new_password_works_and_the_session_goes_on(
    env: &Env,
    conninfo: &str,
    receiver: &str,
) {
    // New connections see the new verifier; the old password is refused.
    let (ok, _, err) = psql_repl(&env.primary, conninfo, STANDBY_PASSWORD, "IDENTIFY_SYSTEM");
    assert!(
        !ok && err.contains("password authentication failed"),
        "the old password still works after the reload: {err}"
    );
    let (ok, _, err) = psql_repl(&env.primary, conninfo, NEW_PASSWORD, "IDENTIFY_SYSTEM");
    assert!(ok, "the new password is refused after the reload: {err}");
    // The session in flight (authenticated with the old password) goes on untouched.
    env.primary
        .execute("create table after_reload as select generate_series(1, 1000) x")
        .await
        .unwrap();
    env.wait_caught_up().await;
    assert_eq!(
        walreceiver_pid(env).await,
        receiver,
        "the standby reconnected"
    );
}

/// Writes `toml` with an invalid session limit, then a file that is not TOML, each with a
/// SIGHUP, and checks that both are refused in the log.
async fn assert_broken_configs_are_not_reloaded(relay: &Relay, toml: &str) {
    // A config that does not validate: logged with its cause, the running one stays.
    std::fs::write(
        &relay.config,
        set_line(toml, "max_sessions = ", "max_sessions = 0"),
    )
    .unwrap();
    relay.signal(libc::SIGHUP);
    let refused = wait_log(relay, "configuration not reloaded");
    assert!(refused.contains("limits.max_sessions"), "{refused}");
    assert!(refused.contains("\"ERROR\""), "{refused}");
    // Also one that is not TOML at all.
    std::fs::write(&relay.config, "[downstream\nlisten = ").unwrap();
    relay.signal(libc::SIGHUP);
    wait_until("the second refusal logged", TIMEOUT, || {
        let n = relay
            .log_text()
            .matches("configuration not reloaded")
            .count();
        async move { Ok(n >= 2) }
    })
    .await
    .unwrap();
}

/// Checks that every line of the relay's log is JSON with the documented fields, that events
/// carry the standby span, and that DEBUG lines appear only after the reload.
fn assert_json_logs_parse(relay: &Relay) {
    // Every line on standard error is a JSON object with the documented fields.
    let log = relay.log_text();
    let mut lines = 0;
    let (mut in_span, mut debug_after_reload, mut reload_seen) = (false, false, false);
    for l in log.lines() {
        let v: serde_json::Value =
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
        assert_documented_fields(&v, l);
        let field = |k: &str| v.get(k).and_then(|x| x.as_str()).unwrap_or("");
        if field("level") == "DEBUG" {
            assert!(reload_seen, "a DEBUG line before the reload: {l}");
            debug_after_reload |= field("target").starts_with("walrelay");
        }
        reload_seen |= field("message").contains("configuration reloaded");
        // Events inside a standby's connection carry the span and its fields.
        if let Some(span) = v.get("span") {
            if span.get("name").and_then(|n| n.as_str()) == Some("standby") {
                assert!(span.get("peer").is_some(), "span without peer: {l}");
                in_span = true;
            }
        }
        lines += 1;
    }
    assert!(lines > 5, "only {lines} log lines:\n{log}");
    assert!(in_span, "no event inside a standby span:\n{log}");
    assert!(
        debug_after_reload,
        "log.level = debug did not take effect on SIGHUP:\n{log}"
    );
}

/// Checks one JSON log line `l` (parsed: `v`): a timestamp, a level, a target and a message.
fn assert_documented_fields(v: &serde_json::Value, l: &str) {
    let field = |k: &str| v.get(k).and_then(|x| x.as_str()).unwrap_or("");
    let ts = field("timestamp");
    assert!(
        ts.len() >= 20 && ts.starts_with("20") && ts.ends_with('Z'),
        "timestamp {ts:?}: {l}"
    );
    assert!(
        ["ERROR", "WARN", "INFO", "DEBUG", "TRACE"].contains(&field("level")),
        "{l}"
    );
    assert!(!field("target").is_empty(), "no target: {l}");
    assert!(!field("message").is_empty(), "no message: {l}");
}

/// The primary's password rotated (`ALTER ROLE`, then `upstream.primary` and SIGHUP): a
/// standby that connects afterwards gets its own connection to the primary with the new
/// password, also on the link stream that opened before the reload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reloaded_primary_password_reaches_standbys_that_connect_afterwards() {
    let env = env(EnvOpts::default()).await;
    const ROTATED: &str = "rotated-primary-secret";
    env.primary
        .execute(&format!("alter role {STANDBY_USER} password '{ROTATED}'"))
        .await
        .unwrap();
    let toml = std::fs::read_to_string(&env.relay.config).unwrap();
    let old = format!("password={REPL_PASSWORD} ");
    assert!(toml.contains(&old), "{toml}");
    let toml = toml.replace(&old, &format!("password={ROTATED} "));
    std::fs::write(&env.relay.config, toml).unwrap();
    env.relay.signal(libc::SIGHUP);
    let reloaded = wait_log(&env.relay, "configuration reloaded");
    assert!(reloaded.contains("upstream.primary"), "{reloaded}");

    let dir = env.root.path().join("after_rotation");
    let mut late = receivewal_streaming(&env.primary, &dir, env.down_port, "after_rotation").await;
    let _ = late.kill();
    let _ = late.wait();
    let log = env.relay.log_text();
    assert_eq!(
        log.matches("link stream open: spooling").count(),
        1,
        "the link stream opened again, so this tested nothing:\n{log}"
    );
    env.relay.assert_no_panic();
}

/// SIGTERM in the middle of a load: the relay tells the standby, exits 0 within the grace
/// period, and the standby resumes through a restarted relay and ends byte-identical.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_streaming_exits_cleanly_and_the_standby_resumes() {
    let mut env = env(EnvOpts::default()).await;
    pgbench(&env.primary, &["-i", "-s", "2", "-q", "postgres"]);
    let load = pgbench_background(&env.primary, &["-c", "2", "-T", "10", "postgres"]);
    tokio::time::sleep(Duration::from_secs(2)).await;

    let status = env.relay.terminate(GRACE + MARGIN);
    assert!(
        status.is_some_and(|s| s.success()),
        "SIGTERM: {status:?}\n{}",
        env.relay.log_text()
    );
    let log = env.relay.log_text();
    assert!(log.contains("SIGTERM: draining"), "{log}");
    // Everything spooled was made durable before the exit, the load still running.
    assert!(log.contains("spool synced"), "{log}");
    // The standby was told why (a FATAL from the relay, not a cut connection).
    let standby = &env.standby;
    wait_until(
        "the standby logs the relay's goodbye",
        TIMEOUT,
        || async move {
            let log = std::fs::read_to_string(standby.log_path()).unwrap_or_default();
            Ok(log.contains("walrelay is shutting down")
                || log.contains("upstream is shutting down"))
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", env.standby.log_tail(30)));

    // The upstream ended its primary connection with Terminate, not by dropping the socket.
    let primary_log = std::fs::read_to_string(env.primary.log_path()).unwrap_or_default();
    assert!(
        !primary_log.contains("unexpected EOF on standby connection"),
        "the relay dropped its primary connection without Terminate:\n{}",
        env.primary.log_tail(20)
    );

    env.relay.restart();
    env.wait_streaming_through_relay().await;
    finish_load_identical(&env, load, "across the SIGTERM").await;
}

/// SIGINT while the link hangs mid-load (no byte crosses, no connection closes): the relay
/// still exits 0 in bounded time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_with_a_hung_link_exits_in_bounded_time() {
    let mut env = env(EnvOpts {
        cuttable_link: true,
        ..Default::default()
    })
    .await;
    pgbench(&env.primary, &["-i", "-s", "1", "-q", "postgres"]);
    let mut load = pgbench_background(&env.primary, &["-c", "2", "-T", "6", "postgres"]);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let cut = env.cut.as_ref().unwrap();
    cut.freeze();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let status = env.relay.stop_with(libc::SIGINT, GRACE + MARGIN);
    cut.thaw();
    let _ = load.wait();
    assert!(
        status.is_some_and(|s| s.success()),
        "SIGINT with a hung link: {status:?}\n{}",
        env.relay.log_text()
    );
    let log = env.relay.log_text();
    assert!(log.contains("SIGINT: draining"), "{log}");
    env.relay.assert_no_panic();
}

/// SIGINT while a replication client (pg_receivewal, stopped with SIGSTOP) no longer reads and
/// the relay's socket and queues toward it are full: the relay cuts that session after the
/// grace period and still exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_with_a_client_that_stopped_reading_exits_in_bounded_time() {
    let root = walrelay_harness::cluster::TempRoot::new().unwrap();
    let p = walrelay_harness::cluster::Cluster::init_primary(
        &install(),
        &root,
        "primary",
        &Default::default(),
    )
    .unwrap();
    p.start().await.unwrap();
    p.create_replication_user(REPL_PASSWORD).await.unwrap();
    let (up, down) = (
        walrelay_harness::cluster::free_port(),
        walrelay_harness::cluster::free_port(),
    );
    let mut relay = start_relay_with_long_keepalives(&root, &p, up, down);
    let mut receiver = start_pg_receivewal(&root, &p, down).await;
    // SAFETY: kill(2) takes plain integers; no memory is involved.
    unsafe { libc::kill(receiver.id() as i32, libc::SIGSTOP) };
    // ~60 MB of WAL it does not read: the relay spools it and its session toward the stopped
    // client blocks once the socket is full.
    p.execute("create table big as select g, md5(g::text) || md5((g + 1)::text) t from generate_series(1, 400000) g")
        .await
        .unwrap();
    wait_until_the_load_is_spooled(&p, down, &relay).await;
    assert_sigint_cuts_the_stuck_session(&mut relay, &mut receiver);
}

/// A standby that stops (SIGSTOP: it neither reads nor replies) while WAL comes is cut after
/// `limits.standby_timeout_secs`, as PostgreSQL's `wal_sender_timeout` cuts it, also with its
/// socket full; its own connection to the primary ends with it, so the primary stops waiting
/// for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_standby_is_cut_after_standby_timeout_secs() {
    let root = walrelay_harness::cluster::TempRoot::new().unwrap();
    let p = Cluster::init_primary(&install(), &root, "primary", &Default::default()).unwrap();
    p.start().await.unwrap();
    p.create_replication_user(REPL_PASSWORD).await.unwrap();
    let (up, down) = (
        walrelay_harness::cluster::free_port(),
        walrelay_harness::cluster::free_port(),
    );
    let toml = both_halves_toml(&p, up, down, up, "", "standby_timeout_secs = 4");
    let relay = Relay::start(root.path(), "relay", &toml, Some(down), Some(up));
    let mut receiver = start_pg_receivewal(&root, &p, down).await;
    // SAFETY: kill(2) takes plain integers; no memory is involved.
    unsafe { libc::kill(receiver.id() as i32, libc::SIGSTOP) };
    p.execute("create table big as select g, md5(g::text) || md5((g + 1)::text) t from generate_series(1, 400000) g")
        .await
        .unwrap();
    let stuck = "select count(*)::text from pg_stat_replication where application_name = 'stuck'";
    let pr = &p;
    let gone = wait_until("the stopped standby cut", TIMEOUT, || async move {
        Ok(pr.query_one_string(stuck).await? == "0")
    })
    .await;
    // SAFETY: as above.
    unsafe { libc::kill(receiver.id() as i32, libc::SIGCONT) };
    let _ = receiver.kill();
    let _ = receiver.wait();
    gone.unwrap_or_else(|e| panic!("{e}\n{}", relay.log_text()));
    let log = relay.log_text();
    assert!(log.contains("no reply from the standby for 4 s"), "{log}");
    relay.assert_no_panic();
}

/// Starts both halves in one relay process, with link keepalives of 10 s.
fn start_relay_with_long_keepalives(root: &TempRoot, p: &Cluster, up: u16, down: u16) -> Relay {
    // A longer keepalive than the harness's 2 s: with 2 s, a stream blocked this long has been
    // seen to end the whole link connection (h2 error) before the signal comes.
    let toml = both_halves_toml(p, up, down, up, "", "")
        .replace("keepalive_secs = 2", "keepalive_secs = 10");
    Relay::start(root.path(), "relay", &toml, Some(down), Some(up))
}

/// Starts pg_receivewal (application_name `stuck`) on the relay's `down` port and waits until
/// it streams.
async fn start_pg_receivewal(root: &TempRoot, p: &Cluster, down: u16) -> std::process::Child {
    receivewal_streaming(p, &root.path().join("receivewal"), down, "stuck").await
}

/// Waits until the relay's spool (for its `down` port) holds 48 MB.
async fn wait_until_the_load_is_spooled(p: &Cluster, down: u16, relay: &Relay) {
    let spool = p.dir().with_file_name(format!("spool-{down}"));
    let spooled = || -> u64 {
        std::fs::read_dir(&spool)
            .map(|d| {
                d.filter_map(|e| e.ok()?.metadata().ok())
                    .map(|m| m.len())
                    .sum()
            })
            .unwrap_or(0)
    };
    let deadline = Instant::now() + TIMEOUT;
    while spooled() < 48 << 20 {
        assert!(
            Instant::now() < deadline,
            "the relay did not spool the load:\n{}",
            relay.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Sends SIGINT to the relay, then resumes and kills the stopped `receiver`; checks that the
/// relay exited 0 after cutting the stuck session.
fn assert_sigint_cuts_the_stuck_session(relay: &mut Relay, receiver: &mut std::process::Child) {
    let status = relay.stop_with(libc::SIGINT, GRACE + MARGIN);
    // SAFETY: kill(2) takes plain integers; no memory is involved.
    unsafe { libc::kill(receiver.id() as i32, libc::SIGCONT) };
    let _ = receiver.kill();
    let _ = receiver.wait();
    assert!(
        status.is_some_and(|s| s.success()),
        "SIGINT with a stuck client: {status:?}\n{}",
        relay.log_text()
    );
    let log = relay.log_text();
    assert!(log.contains("SIGINT: draining"), "{log}");
    assert!(
        log.contains("standby session cut"),
        "the stuck session was not the one holding the drain:\n{log}"
    );
    relay.assert_no_panic();
}

/// What check-config refuses (issue #14), `run` refuses too, before starting anything, with
/// exit status 64 and the dotted key: numbers that would overflow, TLS files that are not
/// what they claim, values of the wrong type.
#[test]
fn check_config_and_run_refuse_what_would_break_run() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("garbage.pem"), "not a certificate\n").unwrap();
    let base = format!(
        "[upstream]\nprimary = \"host=127.0.0.1 port=1 user=u\"\nlisten = \"127.0.0.1:{}\"\n",
        walrelay_harness::cluster::free_port()
    );
    let cases = [
        (
            "[link]\nplaintext = true\n[limits]\nqueue_messages = 9223372036854775807\n",
            "limits.queue_messages",
        ),
        (
            "[link]\nplaintext = true\nkeepalive_secs = 9223372036854775807\n",
            "link.keepalive_secs",
        ),
        (
            "[link]\nplaintext = true\n[limits]\nmax_sessions = \"lots\"\n",
            "limits.max_sessions",
        ),
        (
            &format!(
                "[link]\ntls_cert = \"{0}/garbage.pem\"\ntls_key = \"{0}/garbage.pem\"\n",
                d.display()
            ),
            "link.tls_cert",
        ),
        (
            &format!(
                "[link]\ntls_cert = \"{0}\"\ntls_key = \"{0}\"\n",
                d.display()
            ),
            "link.tls_cert",
        ),
    ];
    for (i, (tail, key)) in cases.iter().enumerate() {
        let path = d.join(format!("case{i}.toml"));
        std::fs::write(&path, format!("{base}{tail}")).unwrap();
        for cmd in ["check-config", "run"] {
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_walrelay"))
                .args([cmd, "--config"])
                .arg(&path)
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(64), "{cmd} case {i}: {err}");
            assert!(err.contains(&format!("`{key}`")), "{cmd} case {i}: {err}");
        }
    }
}
