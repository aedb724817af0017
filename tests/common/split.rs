//! The halves as separate processes, as they run in production: a primary, the upstream next
//! to it, a counting forwarder standing for the WAN link, the downstream, and any number of
//! standbys behind the downstream.

use std::path::PathBuf;
use std::time::Duration;

use walrelay_harness::cluster::{
    free_port, wait_until, Cluster, PrimaryOpts, StandbyOpts, TempRoot,
};

use super::*;

pub struct Split {
    pub primary: Cluster,
    pub upstream: Relay,
    pub downstream: Relay,
    pub link: CutProxy,
    pub down_port: u16,
    pub spool: PathBuf,
    pub standbys: Vec<Cluster>,
    pub root: TempRoot,
}

#[derive(Default)]
pub struct SplitOpts {
    pub primary: PrimaryOpts,
    /// Extra keys for `[downstream]` (e.g. `spool_bytes = 67108864`).
    pub downstream_extra: String,
    /// PostgreSQL major of the primary (default: the system's, see `install()`).
    pub major: Option<u32>,
    /// Extra keys for the upstream's `[limits]` (e.g. `max_sessions = 1`).
    pub upstream_limits: String,
    /// Extra keys for the downstream's `[limits]` (e.g. `standby_timeout_secs = 10`).
    pub downstream_limits: String,
    /// Both halves' `link.keepalive_secs` (default 2: a cut link is noticed fast).
    pub link_keepalive_secs: Option<u64>,
}

impl Split {
    pub async fn new(opts: SplitOpts) -> Split {
        let keepalive = opts.link_keepalive_secs.unwrap_or(2);
        let root = TempRoot::new().unwrap();
        let install = match opts.major {
            None => install(),
            Some(m) => walrelay_harness::cluster::majors::install_for_major(m)
                .unwrap_or_else(|| panic!("PostgreSQL {m} (scripts/install-pg-majors.sh)")),
        };
        let primary = Cluster::init_primary(&install, &root, "primary", &opts.primary).unwrap();
        primary.start().await.unwrap();
        primary
            .create_replication_user(REPL_PASSWORD)
            .await
            .unwrap();
        let (up, down) = (free_port(), free_port());
        let upstream = Relay::start(
            root.path(),
            "upstream",
            &format!(
                "[upstream]\nprimary = \"host=127.0.0.1 port={} user={STANDBY_USER} password={REPL_PASSWORD} sslmode=disable\"\nlisten = \"127.0.0.1:{up}\"\n\n[link]\nplaintext = true\nkeepalive_secs = {keepalive}\n\n[limits]\ndrain_timeout_secs = 3\n{}\n",
                primary.port(),
                opts.upstream_limits,
            ),
            None,
            Some(up),
        );
        let link = CutProxy::start(up).unwrap();
        let spool = root.path().join("spool");
        let downstream = Relay::start(
            root.path(),
            "downstream",
            &format!(
                "[downstream]\nlisten = \"127.0.0.1:{down}\"\nupstream = \"127.0.0.1:{}\"\nauth = \"scram-sha-256\"\nusers = {{ {STANDBY_USER} = \"{}\" }}\nspool_dir = \"{}\"\n{}\n\n[link]\nplaintext = true\nkeepalive_secs = {keepalive}\nconnect_timeout_secs = 3\n\n[limits]\ndrain_timeout_secs = 3\n{}\n",
                link.port,
                walrelay_pgwire::scram::new_verifier(STANDBY_PASSWORD),
                spool.display(),
                opts.downstream_extra,
                opts.downstream_limits,
            ),
            Some(down),
            None,
        );
        Split {
            primary,
            upstream,
            downstream,
            link,
            down_port: down,
            spool,
            standbys: Vec::new(),
            root,
        }
    }

    /// A standby from a base backup of the primary, streaming through the downstream under
    /// `name` (its application_name); returns its index.
    pub fn add_standby(&mut self, name: &str) -> usize {
        self.add_standby_at(name, self.down_port)
    }

    /// [`Split::add_standby`] connecting to `port` (a forwarder in front of the downstream).
    pub fn add_standby_at(&mut self, name: &str, port: u16) -> usize {
        let mut o = StandbyOpts::new(format!(
            "host=127.0.0.1 port={port} user={STANDBY_USER} password={STANDBY_PASSWORD} application_name={name}"
        ));
        o.application_name = Some(name.into());
        let s = self
            .primary
            .basebackup_standby(&self.root, name, &o)
            .unwrap();
        self.standbys.push(s);
        self.standbys.len() - 1
    }

    /// `pg_basebackup` (the primary's major) through the downstream into `dir`, as an
    /// operator in the far datacenter runs it: whether it succeeded, and its stderr.
    pub fn basebackup(&self, dir: &std::path::Path, args: &[&str]) -> (bool, String) {
        let port = self.down_port;
        self.pg_basebackup(port, (STANDBY_USER, STANDBY_PASSWORD), dir, args)
    }

    /// `-h`, `-p` and `-U` for a PostgreSQL client tool reaching the downstream as the standby
    /// user (its password in `PGPASSWORD`: [`STANDBY_PASSWORD`]).
    pub fn client_args(&self) -> [String; 6] {
        let port = self.down_port.to_string();
        ["-h", "127.0.0.1", "-p", &port, "-U", STANDBY_USER].map(String::from)
    }

    /// The same straight from the primary (as its superuser), for a reference.
    pub fn basebackup_direct(&self, dir: &std::path::Path, args: &[&str]) -> (bool, String) {
        let port = self.primary.port();
        self.pg_basebackup(port, ("postgres", ""), dir, args)
    }

    fn pg_basebackup(
        &self,
        port: u16,
        (user, password): (&str, &str),
        dir: &std::path::Path,
        args: &[&str],
    ) -> (bool, String) {
        let out = self
            .primary
            .command("pg_basebackup")
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-U", user])
            .arg("-D")
            .arg(dir)
            .args(args)
            .args(["-c", "fast", "--no-sync", "--no-password"])
            .env("PGPASSWORD", password)
            .env("PGCONNECT_TIMEOUT", "20")
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// A PG 17+ standby `name` through the downstream that synchronizes failover slots
    /// (`sync_replication_slots`, `hot_standby_feedback`, its own physical slot `name` on the
    /// primary, `dbname` in its conninfo), started.
    pub async fn slot_sync_standby(&self, name: &str) -> Cluster {
        let mut o = StandbyOpts::new(format!(
            "host=127.0.0.1 port={} user={STANDBY_USER} password={STANDBY_PASSWORD} application_name={name} dbname=postgres",
            self.down_port
        ));
        o.slot = Some(name.into());
        o.hot_standby_feedback = true;
        o.extra_conf = vec![("sync_replication_slots".into(), "on".into())];
        let standby = self
            .primary
            .basebackup_standby(&self.root, name, &o)
            .unwrap();
        standby.start().await.unwrap();
        standby
    }

    /// Bytes the link carried so far, both directions.
    pub fn link_bytes(&self) -> u64 {
        self.link.bytes_toward_target() + self.link.bytes_from_target()
    }

    pub async fn lsn(&self) -> u64 {
        parse_lsn(
            &self
                .primary
                .query_one_string("select pg_current_wal_lsn()::text")
                .await
                .unwrap(),
        )
    }

    /// Waits until standby `i` streams through the downstream.
    pub async fn wait_streaming(&self, i: usize) {
        let (s, port) = (&self.standbys[i], self.down_port);
        wait_until("standby streaming through the relay", TIMEOUT, || async move {
            let r = s.query_one_string("select coalesce((select status || ':' || sender_port from pg_stat_wal_receiver), '')").await?;
            Ok(r == format!("streaming:{port}"))
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", self.standbys[i].log_tail(30)));
    }

    /// Waits until standby `i` replayed everything the primary flushed so far.
    pub async fn wait_caught_up(&self, i: usize) {
        let target = self
            .primary
            .query_one_string("select pg_current_wal_flush_lsn()::text")
            .await
            .unwrap();
        let s = &self.standbys[i];
        let t = target.clone();
        wait_until(&format!("standby {i} replayed {target}"), TIMEOUT, || {
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
        .unwrap_or_else(|e| panic!("{e}\n{}\n{}", s.log_tail(30), self.downstream.log_text()));
    }

    /// Closes the current segment, waits for every standby, and compares each standby's WAL
    /// and pgbench tables with the primary's; returns the segments compared per standby.
    pub async fn assert_all_identical(&self) -> Vec<usize> {
        self.primary
            .execute("select pg_switch_wal()")
            .await
            .unwrap();
        self.primary
            .execute("create table if not exists after_switch(x int); insert into after_switch values (1)")
            .await
            .unwrap();
        let mut compared = Vec::new();
        for i in 0..self.standbys.len() {
            self.wait_caught_up(i).await;
            let s = &self.standbys[i];
            assert_eq!(
                tables_digest(&self.primary, PGBENCH_TABLES).await,
                tables_digest(s, PGBENCH_TABLES).await,
                "standby {i}"
            );
            let received = s
                .query_one_string("select flushed_lsn::text from pg_stat_wal_receiver")
                .await
                .unwrap();
            compared.push(compare_segments(
                &self.primary.wal_dir(),
                &s.wal_dir(),
                &segment_name(1, parse_lsn(&received)),
            ));
        }
        compared
    }

    /// application_names of the primary's walsenders, sorted, comma-separated.
    pub async fn walsenders(&self) -> String {
        self.primary
            .query_one_string("select coalesce(string_agg(application_name, ',' order by application_name), '') from pg_stat_replication")
            .await
            .unwrap()
    }

    /// Waits until the downstream's spool holds the primary's WAL up to now (IDENTIFY_SYSTEM
    /// on the downstream answers with the spool's end), so link bytes counted afterwards are
    /// the backup's.
    pub async fn wait_spool_caught_up(&self) {
        let target = self.lsn().await;
        let conninfo = format!(
            "host=127.0.0.1 port={} user={STANDBY_USER} replication=true",
            self.down_port
        );
        let primary = &self.primary;
        walrelay_harness::cluster::wait_until("the spool to catch up", TIMEOUT, || {
            let conninfo = conninfo.clone();
            async move {
                let (ok, out, err) =
                    psql_repl(primary, &conninfo, STANDBY_PASSWORD, "IDENTIFY_SYSTEM");
                if !ok {
                    return Err(walrelay_harness::cluster::ClusterError::Other(err));
                }
                let pos = out.trim().split('|').nth(2).unwrap_or("0/0");
                Ok(parse_lsn(pos) >= target)
            }
        })
        .await
        .unwrap();
    }

    /// Total bytes of the spool's segment files.
    pub fn spool_bytes(&self) -> u64 {
        std::fs::read_dir(&self.spool)
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .filter(|e| e.file_name().to_string_lossy().starts_with("0000"))
                    .filter_map(|e| e.metadata().ok())
                    .map(|m| m.len())
                    .sum()
            })
            .unwrap_or(0)
    }
}

/// Sleeps, for tests that let time pass on purpose (a cut link, a stopped standby).
pub async fn pause(secs: u64) {
    tokio::time::sleep(Duration::from_secs(secs)).await;
}
