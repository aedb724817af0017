//! Shared harness for the integration tests: real PostgreSQL clusters (from
//! `walrelay_harness::cluster`), the real `walrelay` binary as a child process
//! (`walrelay_harness::relayproc`), a TCP forwarder that can cut the link
//! (`walrelay_harness::forward`), WAL and table comparisons.
#![allow(dead_code)]

pub mod deploy;
pub mod prom;
pub mod promql;
pub mod split;

use std::path::{Path, PathBuf};
use std::time::Duration;

use walrelay_harness::cluster::{
    free_port, wait_until, Cluster, PgInstall, PrimaryOpts, StandbyOpts, TempRoot,
};
use walrelay_harness::relayproc::{RelayProcess, Session};

pub const REPL_PASSWORD: &str = "repl-secret";
pub const STANDBY_PASSWORD: &str = "standby-secret";
pub const STANDBY_USER: &str = "replicator";
pub const TIMEOUT: Duration = Duration::from_secs(120);

pub fn install() -> PgInstall {
    PgInstall::discover()
        .expect("PostgreSQL server binaries (run scripts/test.sh, which installs them)")
}

/// The relay binary running with a config file (a [`RelayProcess`] that panics instead of
/// returning errors, and prints its log when the test panics); killed on drop.
pub struct Relay {
    proc: RelayProcess,
    pub config: PathBuf,
    pub log: PathBuf,
}

impl Relay {
    /// Writes `toml` to `<root>/<name>.toml` and starts `walrelay run`, waiting until its
    /// listeners (the halves' given here, and `[metrics] listen`) accept connections.
    pub fn start(
        root: &Path,
        name: &str,
        toml: &str,
        downstream: Option<u16>,
        upstream: Option<u16>,
    ) -> Relay {
        Relay::start_with(root, name, toml, downstream, upstream, false)
    }

    /// [`Relay::start`], optionally with the log filter from the config instead of RUST_LOG.
    pub fn start_with(
        root: &Path,
        name: &str,
        toml: &str,
        downstream: Option<u16>,
        upstream: Option<u16>,
        log_from_config: bool,
    ) -> Relay {
        // `[metrics] listen` binds after the halves' listeners: waiting for the halves alone
        // let a test reach the metrics port before it was open.
        let metrics = toml::from_str::<toml::Table>(toml)
            .ok()
            .and_then(|t| t.get("metrics")?.get("listen")?.as_str()?.parse().ok())
            .map(|a: std::net::SocketAddr| a.port())
            .filter(|&p| p != 0);
        let ports: Vec<u16> = [downstream, upstream, metrics]
            .into_iter()
            .flatten()
            .collect();
        let rust_log = (!log_from_config).then_some("walrelay=debug,info");
        let proc = RelayProcess::start(
            Path::new(env!("CARGO_BIN_EXE_walrelay")),
            root,
            name,
            toml,
            &ports,
            rust_log,
            Session::Caller,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        Relay {
            config: proc.config.clone(),
            log: proc.log.clone(),
            proc,
        }
    }

    /// Sends `sig` (e.g. `libc::SIGHUP`) to the running process.
    pub fn signal(&self, sig: i32) {
        self.proc.signal(sig).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Sends `sig` (SIGTERM or SIGINT), then waits for exit (bounded); returns the exit
    /// status, or None (after SIGKILL) if the process was still running at `within`.
    pub fn stop_with(&mut self, sig: i32, within: Duration) -> Option<std::process::ExitStatus> {
        self.proc.stop_with(sig, within)
    }

    pub fn log_text(&self) -> String {
        self.proc.log_text()
    }

    /// SIGKILL (a crash), no draining.
    pub fn kill(&mut self) {
        self.proc.kill();
    }

    /// SIGTERM, then wait for exit (bounded); returns the exit status.
    pub fn terminate(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        self.proc.terminate(within)
    }

    /// SIGKILL, then start again with the same config.
    pub fn restart(&mut self) {
        self.proc.respawn().unwrap_or_else(|e| panic!("{e}"));
    }

    pub fn is_running(&mut self) -> bool {
        self.proc.is_running()
    }

    /// The process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.proc.pid()
    }

    /// The process must not have panicked, nor caught WAL that failed verification (a
    /// standby would reconnect after one, which could hide it).
    pub fn assert_no_panic(&self) {
        let log = self.log_text();
        assert!(!log.contains("panicked"), "walrelay panicked:\n{log}");
        assert!(
            !log.contains("failed verification"),
            "walrelay restored WAL that failed verification:\n{log}"
        );
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!(
                "--- walrelay log ({}) ---\n{}",
                self.log.display(),
                self.log_text()
            );
        }
    }
}

/// Config text for one process running both halves with a plaintext link.
pub fn both_halves_toml(
    primary: &Cluster,
    up_port: u16,
    down_port: u16,
    link_target: u16,
    upstream_extra: &str,
    extra: &str,
) -> String {
    format!(
        r#"
[upstream]
primary = "host=127.0.0.1 port={pport} user={STANDBY_USER} password={REPL_PASSWORD} sslmode=disable"
listen = "127.0.0.1:{up_port}"
{upstream_extra}

[downstream]
listen = "127.0.0.1:{down_port}"
upstream = "127.0.0.1:{link_target}"
auth = "scram-sha-256"
users = {{ {STANDBY_USER} = "{verifier}" }}
spool_dir = "{spool}"

[link]
plaintext = true
keepalive_secs = 2
connect_timeout_secs = 3

[limits]
drain_timeout_secs = 3
{extra}
"#,
        pport = primary.port(),
        verifier = walrelay_pgwire::scram::new_verifier(STANDBY_PASSWORD),
        spool = primary
            .dir()
            .with_file_name(format!("spool-{down_port}"))
            .display(),
    )
}

/// A primary, a standby replicating through the relay, and the relay.
pub struct Env {
    pub primary: Cluster,
    pub standby: Cluster,
    pub relay: Relay,
    pub cut: Option<CutProxy>,
    pub down_port: u16,
    pub root: TempRoot,
}

#[derive(Default)]
pub struct EnvOpts {
    pub primary: PrimaryOpts,
    /// Put a cuttable proxy between the halves.
    pub cuttable_link: bool,
    pub extra_toml: String,
    /// Extra keys for the [upstream] section.
    pub upstream_extra: String,
    /// Extra keys for the [link] section.
    pub link_extra: String,
    /// Extra keys for the [downstream] section.
    pub downstream_extra: String,
    /// Standbys authenticate with `trust` instead of SCRAM.
    pub trust: bool,
    /// PostgreSQL major to run (default: the system's, see `install()`).
    pub major: Option<u32>,
    pub standby_extra_conf: Vec<(String, String)>,
    /// The relay logs with `[log] level` of its config, not the harness's RUST_LOG.
    pub log_from_config: bool,
}

pub fn standby_conninfo(down_port: u16) -> String {
    format!("host=127.0.0.1 port={down_port} user={STANDBY_USER} password={STANDBY_PASSWORD} application_name=standby1")
}

pub async fn env(opts: EnvOpts) -> Env {
    let root = TempRoot::new().unwrap();
    let install = match opts.major {
        None => install(),
        Some(m) => walrelay_harness::cluster::majors::install_for_major(m).unwrap_or_else(|| {
            panic!("PostgreSQL {m} is not installed: run scripts/install-pg-majors.sh")
        }),
    };
    let primary = Cluster::init_primary(&install, &root, "primary", &opts.primary).unwrap();
    primary.start().await.unwrap();
    primary
        .create_replication_user(REPL_PASSWORD)
        .await
        .unwrap();
    let (up_port, down_port) = (free_port(), free_port());
    let cut = opts
        .cuttable_link
        .then(|| CutProxy::start(up_port).expect("starting the link forwarder"));
    let link_target = cut.as_ref().map(|c| c.port).unwrap_or(up_port);
    let mut toml = both_halves_toml(
        &primary,
        up_port,
        down_port,
        link_target,
        &opts.upstream_extra,
        &opts.extra_toml,
    );
    if opts.trust {
        toml = toml.replace("auth = \"scram-sha-256\"", "auth = \"trust\"");
    }
    toml = toml.replace("[link]\n", &format!("[link]\n{}\n", opts.link_extra));
    toml = toml.replace(
        "[downstream]\n",
        &format!("[downstream]\n{}\n", opts.downstream_extra),
    );
    let relay = Relay::start_with(
        root.path(),
        "relay",
        &toml,
        Some(down_port),
        Some(up_port),
        opts.log_from_config,
    );
    let mut sopts = StandbyOpts::new(standby_conninfo(down_port));
    sopts.application_name = Some("standby1".into());
    sopts.extra_conf = opts.standby_extra_conf;
    let standby = primary
        .basebackup_standby(&root, "standby", &sopts)
        .unwrap();
    standby.start().await.unwrap();
    let env = Env {
        primary,
        standby,
        relay,
        cut,
        down_port,
        root,
    };
    env.wait_streaming_through_relay().await;
    env
}

impl Env {
    /// Waits until the standby's WAL receiver streams from the relay's downstream port.
    pub async fn wait_streaming_through_relay(&self) {
        let port = self.down_port;
        let standby = &self.standby;
        wait_until("standby streaming through the relay", TIMEOUT, || async move {
            let s = standby.query_one_string("select coalesce((select status || ':' || sender_port from pg_stat_wal_receiver), '')").await?;
            Ok(s == format!("streaming:{port}"))
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\nstandby log:\n{}", self.standby.log_tail(30)));
    }

    /// Switches the primary to a new WAL segment and writes a little into it, so that every
    /// segment written so far is complete (and comparable) on both sides.
    pub async fn close_segment(&self) {
        self.primary
            .execute("select pg_switch_wal()")
            .await
            .unwrap();
        self.primary
            .execute("create table after_switch(x int); insert into after_switch values (1)")
            .await
            .unwrap();
    }

    /// Waits until the standby has replayed everything the primary has written so far.
    pub async fn wait_caught_up(&self) {
        let target = self
            .primary
            .query_one_string("select pg_current_wal_flush_lsn()::text")
            .await
            .unwrap();
        let standby = &self.standby;
        let t = target.clone();
        wait_until(&format!("standby replayed up to {target}"), TIMEOUT, || {
            let t = t.clone();
            async move {
                let ok = standby
                    .query_one_string(&format!(
                        "select (pg_last_wal_replay_lsn() >= '{t}'::pg_lsn)::text"
                    ))
                    .await?;
                Ok(ok == "true")
            }
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\nstandby log:\n{}", self.standby.log_tail(30)));
    }
}

impl Env {
    /// The standby holds the primary's pgbench tables, and every complete WAL segment it
    /// received is byte-identical to the primary's; returns how many segments were compared.
    pub async fn assert_identical(&self) -> usize {
        assert_eq!(
            tables_digest(&self.primary, PGBENCH_TABLES).await,
            tables_digest(&self.standby, PGBENCH_TABLES).await
        );
        let received = self
            .standby
            .query_one_string("select flushed_lsn::text from pg_stat_wal_receiver")
            .await
            .unwrap();
        compare_segments(
            &self.primary.wal_dir(),
            &self.standby.wal_dir(),
            &segment_name(1, parse_lsn(&received)),
        )
    }
}

/// Digest of the pgbench tables (or any table list), to compare primary and standby.
pub async fn tables_digest(c: &Cluster, tables: &[&str]) -> String {
    let mut out = String::new();
    for t in tables {
        let d = c.query_one_string(&format!("select count(*) || ':' || coalesce(md5(string_agg(x::text, ',' order by x::text)), '') from {t} x")).await.unwrap();
        out.push_str(&format!("{t}={d};"));
    }
    out
}

pub const PGBENCH_TABLES: &[&str] = &[
    "pgbench_accounts",
    "pgbench_branches",
    "pgbench_tellers",
    "pgbench_history",
];

/// Runs pgbench to completion, asserting success.
pub fn pgbench(c: &Cluster, args: &[&str]) {
    let out = c.pgbench(args).output().unwrap();
    assert!(
        out.status.success(),
        "pgbench {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Waits for a background pgbench to succeed and closes the segment it wrote into; then the
/// standby catches up, its WAL is byte-identical to the primary's, and the relay never panicked.
pub async fn finish_load_identical(env: &Env, mut load: std::process::Child, what: &str) {
    let status = tokio::task::spawn_blocking(move || load.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "pgbench failed {what}");
    env.close_segment().await;
    env.wait_caught_up().await;
    let n = env.assert_identical().await;
    assert!(n >= 1, "no complete segment to compare");
    env.relay.assert_no_panic();
}

/// Starts pgbench in the background (output discarded); wait for it or kill it.
pub fn pgbench_background(c: &Cluster, args: &[&str]) -> std::process::Child {
    c.pgbench(args)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

/// Segment file name for an LSN on a timeline (16 MB segments).
pub fn segment_name(tli: u32, lsn: u64) -> String {
    let seg = walrelay_wal::segment::WalSegSize::DEFAULT;
    let segno = seg.segment_of(walrelay_wal::lsn::Lsn(lsn));
    seg.file_name(walrelay_wal::lsn::TimeLineId(tli), segno)
}

pub fn parse_lsn(s: &str) -> u64 {
    s.parse::<walrelay_wal::lsn::Lsn>().unwrap().0
}

/// Compares every complete WAL segment (name < `before`) present in both directories byte
/// for byte; returns how many were compared.
pub fn compare_segments(a: &Path, b: &Path, before: &str) -> usize {
    let mut compared = 0;
    let mut names: Vec<String> = std::fs::read_dir(a)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.len() == 24 && n.chars().all(|c| c.is_ascii_hexdigit()))
        .collect();
    names.sort();
    for n in names.iter().filter(|n| n.as_str() < before) {
        let pb = b.join(n);
        if !pb.exists() {
            continue;
        }
        let (x, y) = (
            std::fs::read(a.join(n)).unwrap(),
            std::fs::read(&pb).unwrap(),
        );
        assert_eq!(x.len(), y.len(), "segment {n} differs in size");
        if let Some(off) = x.iter().zip(&y).position(|(p, q)| p != q) {
            panic!("segment {n} differs at byte offset {off:#x}");
        }
        compared += 1;
    }
    compared
}

/// The TCP forwarder standing for the WAN link: `cut()` drops every connection and refuses new
/// ones until `restore()`; `freeze()` keeps connections open but stops moving bytes (a link
/// that hangs) until `thaw()`; it can flip one byte in either direction.
pub use walrelay_harness::forward::Forwarder as CutProxy;

/// Runs psql on a replication connection; returns (success, stdout, stderr).
pub fn psql_repl(c: &Cluster, conninfo: &str, password: &str, sql: &str) -> (bool, String, String) {
    let out = c
        .command("psql")
        .args([conninfo, "-XAt", "-c", sql])
        .env("PGPASSWORD", password)
        .env("PGCONNECT_TIMEOUT", "20")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `pg_receivewal --no-loop` (the primary `p`'s) into `dir`, through the downstream on `port`
/// as `name`; returns once its own connection to the primary streams.
pub async fn receivewal_streaming(
    p: &Cluster,
    dir: &Path,
    port: u16,
    name: &str,
) -> std::process::Child {
    std::fs::create_dir_all(dir).unwrap();
    let conninfo =
        format!("host=127.0.0.1 port={port} user={STANDBY_USER} application_name={name}");
    let child = p
        .command("pg_receivewal")
        .arg("-D")
        .arg(dir)
        .args(["-d", &conninfo, "--no-loop"])
        .env("PGPASSWORD", STANDBY_PASSWORD)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let sql = format!("select count(*)::text from pg_stat_replication where application_name = '{name}' and state = 'streaming'");
    let sql = &sql;
    walrelay_harness::cluster::wait_until(
        "pg_receivewal's own connection to stream",
        TIMEOUT,
        || async move { Ok(p.query_one_string(sql).await? == "1") },
    )
    .await
    .unwrap();
    child
}

/// The kernel's timer state (`tr` of /proc/net/tcp: 00 none, 01 retransmit, 02 keepalive)
/// of each TCP socket process `pid` holds toward local port `remote_port`.
pub fn tcp_timers_toward(pid: u32, remote_port: u16) -> Vec<String> {
    use std::collections::HashSet;
    let inodes: HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy().into_owned();
            Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
        })
        .collect();
    let tcp = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let port_of = |a: &str| {
        a.rsplit(':')
            .next()
            .and_then(|p| u16::from_str_radix(p, 16).ok())
    };
    tcp.lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|f| f.len() > 9 && port_of(f[2]) == Some(remote_port) && inodes.contains(f[9]))
        .map(|f| f[5].split(':').next().unwrap_or_default().to_string())
        .collect()
}

/// A primary of the system's PostgreSQL in `root`, started, with the replication user the
/// relay connects as.
pub async fn replication_primary(root: &TempRoot) -> Cluster {
    let primary = Cluster::init_primary(&install(), root, "primary", &Default::default()).unwrap();
    primary.start().await.unwrap();
    primary
        .create_replication_user(REPL_PASSWORD)
        .await
        .unwrap();
    primary
}

/// The `postgres` user's uid (0 when there is none): key files a server reads must be its.
pub fn postgres_uid() -> u32 {
    let out = std::process::Command::new("id")
        .args(["-u", "postgres"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0)
}
