//! One throw-away PostgreSQL instance.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use super::{
    as_pg_user, chown_to_pg, chown_tree_to_pg, free_port, run_async, run_sync, ClusterError,
    PgInstall, TempRoot,
};

/// Settings for [`Cluster::init_primary`]. `Default` gives wal_level 'replica', checkpoint_timeout
/// '5min', wal_compression 'off' and a [`free_port`].
#[derive(Debug, Clone)]
pub struct PrimaryOpts {
    pub port: Option<u16>,
    pub wal_level: String,
    pub checkpoint_timeout: String,
    pub wal_compression: String,
    /// Appended last to postgresql.conf, so they override everything above. Values are quoted.
    pub extra_conf: Vec<(String, String)>,
}

impl Default for PrimaryOpts {
    fn default() -> Self {
        PrimaryOpts {
            port: None,
            wal_level: "replica".into(),
            checkpoint_timeout: "5min".into(),
            wal_compression: "off".into(),
            extra_conf: Vec::new(),
        }
    }
}

/// Settings for [`Cluster::basebackup_standby`].
#[derive(Debug, Clone, Default)]
pub struct StandbyOpts {
    /// Full conninfo of the upstream (typically the relay), e.g. `host=127.0.0.1 port=6543
    /// user=replicator password=secret`.
    pub primary_conninfo: String,
    /// `primary_slot_name`; the slot must exist upstream.
    pub slot: Option<String>,
    /// Set as `cluster_name`, which the walreceiver sends as application_name when
    /// primary_conninfo has none. Defaults to the standby's name.
    pub application_name: Option<String>,
    pub hot_standby_feedback: bool,
    /// Defaults to a [`free_port`].
    pub port: Option<u16>,
    /// Appended last to postgresql.auto.conf. Values are quoted.
    pub extra_conf: Vec<(String, String)>,
}

impl StandbyOpts {
    pub fn new(primary_conninfo: impl Into<String>) -> StandbyOpts {
        StandbyOpts {
            primary_conninfo: primary_conninfo.into(),
            ..Default::default()
        }
    }
}

/// One PostgreSQL instance in a [`TempRoot`]. Dropping it stops the server (immediate mode);
/// the data directory goes when the `TempRoot` does.
#[derive(Debug)]
pub struct Cluster {
    install: PgInstall,
    name: String,
    dir: PathBuf,
    port: u16,
    /// Keeps the temporary directory alive until this cluster has stopped.
    _root: Arc<tempfile::TempDir>,
    /// A start was issued and no stop completed since: a postmaster may be coming up even
    /// while `postmaster.pid` is not there yet (a run dropped mid-start, on Ctrl-C).
    start_issued: std::sync::atomic::AtomicBool,
}

const PG_CTL_TIMEOUT_SECS: &str = "60";

impl Cluster {
    /// `initdb` a new primary in `<root>/<name>` and configure it for replication. Not started.
    pub fn init_primary(
        install: &PgInstall,
        root: &TempRoot,
        name: &str,
        opts: &PrimaryOpts,
    ) -> Result<Cluster, ClusterError> {
        let cluster = Cluster::new(install, root, name, opts.port);
        let mut cmd = cluster.server_tool("initdb")?;
        cmd.arg("-D").arg(&cluster.dir);
        cmd.args([
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--no-locale",
            "-A",
            "trust",
            "--no-sync",
        ]);
        run_sync(cmd)?;

        let mut conf = cluster.common_conf();
        for (k, v) in [
            ("listen_addresses", "127.0.0.1"),
            ("wal_level", &opts.wal_level),
            ("max_wal_senders", "10"),
            ("max_replication_slots", "10"),
            ("wal_keep_size", "1GB"),
            ("hot_standby", "on"),
            ("fsync", "off"),
            ("checkpoint_timeout", &opts.checkpoint_timeout),
            ("wal_compression", &opts.wal_compression),
            ("full_page_writes", "on"),
            ("logging_collector", "off"),
        ] {
            conf.push_str(&conf_line(k, v));
        }
        for (k, v) in &opts.extra_conf {
            conf.push_str(&conf_line(k, v));
        }
        write_file(&cluster.dir.join("postgresql.conf"), &conf, true)?;
        let hba = "\
# written by walrelay::cluster
local all         all                      trust
host  all         postgres   127.0.0.1/32  trust
host  replication postgres   127.0.0.1/32  trust
host  replication replicator 127.0.0.1/32  scram-sha-256
host  all         all        127.0.0.1/32  scram-sha-256
";
        write_file(&cluster.dir.join("pg_hba.conf"), hba, false)?;
        Ok(cluster)
    }

    /// `pg_basebackup` this (running) cluster into `<root>/<name>` and make the copy a standby
    /// streaming from `opts.primary_conninfo`. Not started.
    pub fn basebackup_standby(
        &self,
        root: &TempRoot,
        name: &str,
        opts: &StandbyOpts,
    ) -> Result<Cluster, ClusterError> {
        if !self.is_running() {
            return Err(ClusterError::Other(format!(
                "cannot base-backup cluster {:?}: it is not running",
                self.name
            )));
        }
        let standby = Cluster::new(&self.install, root, name, opts.port);
        let mut cmd = standby.server_tool("pg_basebackup")?;
        cmd.args([
            "-h",
            "127.0.0.1",
            "-p",
            &self.port.to_string(),
            "-U",
            "postgres",
            "-D",
        ]);
        cmd.arg(&standby.dir);
        cmd.args(["-X", "stream", "-c", "fast", "--no-sync", "--no-password"]);
        run_sync(cmd)?;

        remove_primary_leftovers(&standby.dir)?;
        write_file(&standby.dir.join("standby.signal"), "", false)?;

        let app_name = opts.application_name.as_deref().unwrap_or(name);
        let mut conf = standby.common_conf();
        conf.push_str(&conf_line("cluster_name", app_name));
        conf.push_str(&conf_line("primary_conninfo", &opts.primary_conninfo));
        if let Some(slot) = &opts.slot {
            conf.push_str(&conf_line("primary_slot_name", slot));
        }
        conf.push_str(&conf_line("wal_receiver_status_interval", "1s"));
        conf.push_str(&conf_line("wal_retrieve_retry_interval", "1s"));
        conf.push_str(&conf_line(
            "hot_standby_feedback",
            if opts.hot_standby_feedback {
                "on"
            } else {
                "off"
            },
        ));
        for (k, v) in &opts.extra_conf {
            conf.push_str(&conf_line(k, v));
        }
        write_file(&standby.dir.join("postgresql.auto.conf"), &conf, true)?;
        Ok(standby)
    }

    /// A standby made only by `pg_basebackup <source> -D <dir> -R <extra>` from any server
    /// (e.g. walrelay's downstream), as an operator would: `-R` writes `standby.signal` and a
    /// `primary_conninfo` pointing at the source; this adds only the instance's own port,
    /// socket directory and name (`cluster_name`, the walreceiver's application_name) and
    /// status intervals. `env` goes to pg_basebackup (e.g. PGPASSWORD). Not started.
    pub fn standby_from_basebackup(
        install: &PgInstall,
        root: &TempRoot,
        name: &str,
        source: &[&str],
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Cluster, ClusterError> {
        let standby = Cluster::new(install, root, name, None);
        let mut cmd = standby.server_tool("pg_basebackup")?;
        cmd.args(source)
            .arg("-D")
            .arg(&standby.dir)
            .arg("-R")
            .args(extra);
        cmd.args(["--no-sync", "--no-password"]);
        cmd.envs(env.iter().copied());
        run_sync(cmd)?;
        remove_primary_leftovers(&standby.dir)?;
        let mut conf = standby.common_conf();
        conf.push_str(&conf_line("wal_receiver_status_interval", "1s"));
        conf.push_str(&conf_line("wal_retrieve_retry_interval", "1s"));
        write_file(&standby.dir.join("postgresql.auto.conf"), &conf, true)?;
        Ok(standby)
    }

    /// An instance on a data directory that already exists at `<root>/<name>` (a restored
    /// backup, e.g. the output of `pg_combinebackup`): given to the `postgres` user when root,
    /// with its own port, socket directory and name appended to `postgresql.auto.conf`. Not
    /// started; starting it recovers from the backup's WAL.
    pub fn from_data_dir(
        install: &PgInstall,
        root: &TempRoot,
        name: &str,
    ) -> Result<Cluster, ClusterError> {
        let cluster = Cluster::new(install, root, name, None);
        if !cluster.dir.join("PG_VERSION").is_file() {
            return Err(ClusterError::Other(format!(
                "{} is not a PostgreSQL data directory (no PG_VERSION)",
                cluster.dir.display()
            )));
        }
        chown_tree_to_pg(&cluster.dir)?;
        std::fs::set_permissions(&cluster.dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| ClusterError::io(format!("chmod {}", cluster.dir.display()), e))?;
        remove_primary_leftovers(&cluster.dir)?;
        let conf = cluster.common_conf();
        write_file(&cluster.dir.join("postgresql.auto.conf"), &conf, true)?;
        Ok(cluster)
    }

    fn new(install: &PgInstall, root: &TempRoot, name: &str, port: Option<u16>) -> Cluster {
        Cluster {
            install: install.clone(),
            name: name.to_string(),
            dir: root.path().join(name),
            port: port.unwrap_or_else(free_port),
            _root: root.handle(),
            start_issued: false.into(),
        }
    }

    /// Settings every instance gets (a standby's postgresql.conf is a copy of the primary's).
    fn common_conf(&self) -> String {
        let mut conf = String::from("\n# added by walrelay::cluster\n");
        conf.push_str(&conf_line("port", &self.port.to_string()));
        conf.push_str(&conf_line(
            "unix_socket_directories",
            &self.dir.to_string_lossy(),
        ));
        conf.push_str(&conf_line("cluster_name", &self.name));
        conf
    }

    /// A server program (initdb, pg_ctl, ...) set up to run as the `postgres` user when root.
    fn server_tool(&self, tool: &str) -> Result<Command, ClusterError> {
        let mut cmd = Command::new(self.install.bin(tool));
        // The caller's working directory may not be readable by the postgres user.
        cmd.current_dir(self.dir.parent().unwrap_or(Path::new("/")));
        cmd.env_remove("PGDATA").env_remove("PGOPTIONS");
        as_pg_user(&mut cmd)?;
        Ok(cmd)
    }

    fn pg_ctl(&self, args: &[&str]) -> Result<Command, ClusterError> {
        let mut cmd = self.server_tool("pg_ctl")?;
        cmd.args(["-w", "-t", PG_CTL_TIMEOUT_SECS, "-D"])
            .arg(&self.dir);
        cmd.arg("-l").arg(self.log_path()).args(args);
        Ok(cmd)
    }

    async fn run_pg_ctl(&self, args: &[&str]) -> Result<(), ClusterError> {
        match run_async(self.pg_ctl(args)?).await {
            Ok(_) => Ok(()),
            Err(ClusterError::Command { cmd, detail }) => Err(ClusterError::Command {
                cmd,
                detail: format!(
                    "{detail}\n--- last lines of {} ---\n{}",
                    self.log_path().display(),
                    self.log_tail(30)
                ),
            }),
            Err(e) => Err(e),
        }
    }

    /// `pg_ctl start`, waiting (up to 60 s) until the server accepts connections.
    pub async fn start(&self) -> Result<(), ClusterError> {
        self.start_issued.store(true, Relaxed);
        self.run_pg_ctl(&["start"]).await
    }

    /// Fast shutdown. A no-op if the server is not running.
    ///
    /// These are async because a primary's fast shutdown waits for its walsenders to hand all
    /// WAL to their receiver — possibly a relay running on the caller's own runtime.
    pub async fn stop(&self) -> Result<(), ClusterError> {
        if !self.is_running() {
            return Ok(());
        }
        self.run_pg_ctl(&["-m", "fast", "stop"]).await?;
        self.start_issued.store(false, Relaxed);
        Ok(())
    }

    /// Immediate shutdown (crash-like; recovery on next start). A no-op if not running.
    pub async fn stop_immediate(&self) -> Result<(), ClusterError> {
        if !self.is_running() {
            return Ok(());
        }
        self.run_pg_ctl(&["-m", "immediate", "stop"]).await?;
        self.start_issued.store(false, Relaxed);
        Ok(())
    }

    /// Fast shutdown then start.
    pub async fn restart(&self) -> Result<(), ClusterError> {
        self.start_issued.store(true, Relaxed);
        self.run_pg_ctl(&["-m", "fast", "restart"]).await
    }

    /// Whether the postmaster in `postmaster.pid` is alive (no subprocess involved).
    pub fn is_running(&self) -> bool {
        self.postmaster_pid()
            .is_some_and(|pid| pid_alive(pid as libc::pid_t))
    }

    /// The postmaster's pid as `postmaster.pid` gives it (None while there is none).
    pub fn postmaster_pid(&self) -> Option<u32> {
        let text = std::fs::read_to_string(self.dir.join("postmaster.pid")).ok()?;
        text.lines().next()?.trim().parse().ok()
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The data directory (also holds the Unix socket and `postgres.log`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn wal_dir(&self) -> PathBuf {
        self.dir.join("pg_wal")
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.join("postgres.log")
    }

    /// The last `lines` lines of `postgres.log` (empty if there is none).
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read(self.log_path()).unwrap_or_default();
        let text = String::from_utf8_lossy(&text);
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn install(&self) -> &PgInstall {
        &self.install
    }

    /// Conninfo for this server as superuser: `host=127.0.0.1 port=N user=postgres dbname=postgres`.
    pub fn conninfo(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres",
            self.port
        )
    }

    /// A new superuser connection (TCP, no TLS); its connection task is spawned.
    pub async fn connect(&self) -> Result<tokio_postgres::Client, ClusterError> {
        let (client, connection) = tokio_postgres::Config::new()
            .host("127.0.0.1")
            .port(self.port)
            .user("postgres")
            .dbname("postgres")
            .connect_timeout(Duration::from_secs(10))
            .connect(tokio_postgres::NoTls)
            .await
            .map_err(|source| ClusterError::Postgres {
                context: format!(
                    "connecting to cluster {:?} on port {}",
                    self.name, self.port
                ),
                source,
            })?;
        let name = self.name.clone();
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(cluster = %name, "connection ended: {e}");
            }
        });
        Ok(client)
    }

    /// An LSN-valued query (`select pg_current_wal_lsn()::text`, ...).
    pub async fn query_lsn(&self, sql: &str) -> Result<walrelay_wal::lsn::Lsn, ClusterError> {
        let s = self.query_one_string(sql).await?;
        s.parse()
            .map_err(|e| ClusterError::Other(format!("{sql:?} on {:?}: {e}", self.name())))
    }

    /// First column of the first row, as the server's text form (no cast needed). A NULL or an
    /// empty result is an error.
    pub async fn query_one_string(&self, sql: &str) -> Result<String, ClusterError> {
        let client = self.connect().await?;
        let messages = client
            .simple_query(sql)
            .await
            .map_err(|e| self.sql_error(sql, e))?;
        for msg in messages {
            if let tokio_postgres::SimpleQueryMessage::Row(row) = msg {
                return row.get(0).map(str::to_string).ok_or_else(|| {
                    ClusterError::Other(format!("{sql:?} on {:?} returned NULL", self.name))
                });
            }
        }
        Err(ClusterError::Other(format!(
            "{sql:?} on {:?} returned no rows",
            self.name
        )))
    }

    /// Runs one or more `;`-separated statements.
    pub async fn execute(&self, sql: &str) -> Result<(), ClusterError> {
        let client = self.connect().await?;
        client
            .batch_execute(sql)
            .await
            .map_err(|e| self.sql_error(sql, e))
    }

    /// `CREATE ROLE replicator WITH REPLICATION LOGIN` with a SCRAM-SHA-256 password (what
    /// pg_hba.conf requires of `replicator`).
    pub async fn create_replication_user(&self, password: &str) -> Result<(), ClusterError> {
        self.execute(&format!(
            "SET password_encryption = 'scram-sha-256'; \
             CREATE ROLE replicator WITH REPLICATION LOGIN PASSWORD {}",
            sql_literal(password)
        ))
        .await
    }

    /// `pg_create_physical_replication_slot(name)`, reserving WAL immediately.
    pub async fn create_physical_slot(&self, slot: &str) -> Result<(), ClusterError> {
        self.execute(&format!(
            "SELECT pg_create_physical_replication_slot({}, true)",
            sql_literal(slot)
        ))
        .await
    }

    fn sql_error(&self, sql: &str, source: tokio_postgres::Error) -> ClusterError {
        let context = match source.as_db_error() {
            Some(db) => format!("{sql:?} on cluster {:?}: {}", self.name, db.message()),
            None => format!("{sql:?} on cluster {:?}", self.name),
        };
        ClusterError::Postgres { context, source }
    }

    /// `pgbench -h 127.0.0.1 -p <port> -U postgres <args>`; runs as the caller.
    pub fn pgbench(&self, args: &[&str]) -> Command {
        let mut cmd = self.command("pgbench");
        cmd.args([
            "-h",
            "127.0.0.1",
            "-p",
            &self.port.to_string(),
            "-U",
            "postgres",
        ]);
        cmd.args(args);
        cmd
    }

    /// Any program from the bin directory (psql, pg_receivewal, ...), no arguments; runs as
    /// the caller.
    pub fn command(&self, tool: &str) -> Command {
        Command::new(self.install.bin(tool))
    }
}

/// How long a dropped cluster waits for a postmaster that was starting to write its pid file.
const STARTING_GRACE: Duration = Duration::from_secs(3);

impl Drop for Cluster {
    fn drop(&mut self) {
        // A start in flight when its run was dropped: its postmaster writes `postmaster.pid`
        // within moments of being forked; wait for it so that it is stopped, not orphaned.
        if self.start_issued.load(Relaxed) && !self.is_running() {
            let until = std::time::Instant::now() + STARTING_GRACE;
            while !self.is_running() && std::time::Instant::now() < until {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        if self.is_running() {
            if let Ok(cmd) = self.pg_ctl(&["-m", "immediate", "stop"]) {
                let _ = run_sync(cmd);
            }
        }
    }
}

/// Whether `pid` exists and is not a zombie. A postmaster is re-parented to init when pg_ctl
/// exits, so after it dies it may linger as a zombie until init reaps it.
pub(crate) fn pid_alive(pid: libc::pid_t) -> bool {
    if pid <= 0 {
        return false;
    }
    if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // Format: `pid (comm) state ...`; comm may contain spaces and parentheses.
        return stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X");
    }
    // No procfs (or the process is gone): fall back to signal 0, which only checks existence.
    // SAFETY: kill with signal 0 sends nothing.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// A base backup includes the primary's log and socket lock file; neither belongs to a standby.
fn remove_primary_leftovers(dir: &Path) -> Result<(), ClusterError> {
    for entry in std::fs::read_dir(dir)
        .map_err(|e| ClusterError::io(format!("reading {}", dir.display()), e))?
    {
        let entry = entry.map_err(|e| ClusterError::io("reading directory entry", e))?;
        let file_name = entry.file_name().to_string_lossy().into_owned();
        if file_name == "postgres.log" || file_name.starts_with(".s.PGSQL.") {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    Ok(())
}

/// `key = 'value'` with the value quoted for postgresql.conf (any setting may be quoted).
fn conf_line(key: &str, value: &str) -> String {
    format!(
        "{key} = '{}'\n",
        value.replace('\\', "\\\\").replace('\'', "''")
    )
}

fn sql_literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// Writes (or appends to) a file, giving it to the `postgres` user when root.
fn write_file(path: &Path, text: &str, append: bool) -> Result<(), ClusterError> {
    let ctx = || format!("writing {}", path.display());
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .append(append)
        .truncate(!append)
        .open(path)
        .map_err(|e| ClusterError::io(ctx(), e))?;
    file.write_all(text.as_bytes())
        .map_err(|e| ClusterError::io(ctx(), e))?;
    chown_to_pg(path)
}
