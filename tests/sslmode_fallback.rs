//! `sslmode=allow` and `prefer` toward the primary fall back as libpq's do: a second try on
//! the same host, with the other transport, when the primary refuses the first one during
//! authentication. Real PostgreSQL with TLS on and a `pg_hba.conf` that lets the replication
//! user in only over TLS (`hostssl`) or only in the clear (`hostnossl`).
#![deny(clippy::undocumented_unsafe_blocks)]

mod common;

use common::*;
use walrelay::conninfo::ConnInfo;
use walrelay::pgclient::{self, PgClientError, PrimaryConn};
use walrelay_harness::certs::Ca;
use walrelay_harness::cluster::{free_port, wait_until, Cluster, PrimaryOpts, TempRoot};

const MAX_MESSAGE: usize = 4 << 20;
const PASSWORD_FAILED: &str = "password authentication failed for user \"replicator\"";

/// A started primary with TLS on (a certificate from a throwaway CA) whose `pg_hba.conf` lets
/// the replication user in only through a `kind` line (`hostssl`, `hostnossl` or `host`).
async fn tls_primary_with_hba(root: &TempRoot, kind: &str) -> Cluster {
    let dir = root.path();
    let ca = Ca::new("walrelay test CA").unwrap();
    let cert = ca
        .issue(dir, "pgserver", &["localhost", "127.0.0.1"])
        .unwrap();
    for f in [&cert.cert, &cert.key] {
        std::os::unix::fs::chown(f, Some(postgres_uid()), None).ok();
        std::fs::set_permissions(f, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    }
    let opts = PrimaryOpts {
        extra_conf: vec![
            ("ssl".into(), "on".into()),
            ("ssl_cert_file".into(), cert.cert.display().to_string()),
            ("ssl_key_file".into(), cert.key.display().to_string()),
        ],
        ..Default::default()
    };
    let p = Cluster::init_primary(&install(), root, "primary", &opts).unwrap();
    write_hba(&p, kind);
    p.start().await.unwrap();
    p.create_replication_user(REPL_PASSWORD).await.unwrap();
    p
}

/// Replaces the primary's `pg_hba.conf`: the harness's own superuser connections as before,
/// the replication user only through a `kind` line.
fn write_hba(p: &Cluster, kind: &str) {
    let hba = format!(
        "local all all trust\n\
         host all postgres 127.0.0.1/32 trust\n\
         {kind} replication replicator 127.0.0.1/32 scram-sha-256\n"
    );
    // Truncating the existing file keeps its owner (the server's user).
    std::fs::write(p.dir().join("pg_hba.conf"), hba).unwrap();
}

/// [`write_hba`] on a running primary, and waits until it is in force: until a connection
/// with `works` (and the right password) gets in.
async fn switch_hba(p: &Cluster, kind: &str, works: &str) {
    write_hba(p, kind);
    p.execute("select pg_reload_conf()").await.unwrap();
    let ci = conninfo(p, REPL_PASSWORD, works);
    let ci = &ci;
    wait_until(
        &format!("the primary lets {works} in"),
        TIMEOUT,
        || async move {
            Ok(match connect(ci).await {
                Ok(mut c) => {
                    c.terminate().await;
                    true
                }
                Err(_) => false,
            })
        },
    )
    .await
    .unwrap();
}

fn conninfo(p: &Cluster, password: &str, extra: &str) -> String {
    format!(
        "host=127.0.0.1 port={} user={STANDBY_USER} password={password} connect_timeout=10 {extra}",
        p.port()
    )
}

async fn connect(conninfo: &str) -> Result<PrimaryConn, PgClientError> {
    pgclient::connect(&ConnInfo::parse(conninfo).unwrap(), "probe", MAX_MESSAGE).await
}

/// Whether the primary sees the open connection named `probe` as a TLS one.
async fn probe_uses_tls(p: &Cluster) -> bool {
    let ssl = p
        .query_one_string(
            "select coalesce(string_agg(s.ssl::text, ','), 'none') from pg_stat_ssl s \
             join pg_stat_activity a using (pid) where a.application_name = 'probe'",
        )
        .await
        .unwrap();
    match ssl.as_str() {
        "true" => true,
        "false" => false,
        other => panic!("expected one connection named probe, pg_stat_ssl says {other:?}"),
    }
}

fn refused(r: Result<PrimaryConn, PgClientError>, what: &str) -> String {
    match r {
        Ok(_) => panic!("{what}: connected, expected a refusal"),
        Err(e) => e.to_string(),
    }
}

/// `allow` connects in the clear first; refused there (`no pg_hba.conf entry ... no
/// encryption`), it tries again with TLS, and is let in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_tries_tls_when_the_primary_accepts_only_hostssl() {
    let root = TempRoot::new().unwrap();
    let p = tls_primary_with_hba(&root, "hostssl").await;

    let e = refused(
        connect(&conninfo(&p, REPL_PASSWORD, "sslmode=disable")).await,
        "sslmode=disable to a hostssl-only primary",
    );
    assert!(e.contains("no pg_hba.conf entry"), "{e}");

    let mut conn = connect(&conninfo(&p, REPL_PASSWORD, "sslmode=allow"))
        .await
        .unwrap_or_else(|e| panic!("sslmode=allow: {e}\n{}", p.log_tail(10)));
    assert!(
        probe_uses_tls(&p).await,
        "sslmode=allow is in, but not over TLS"
    );
    conn.terminate().await;
}

/// `prefer` (and the default) asks for TLS and gets it; refused over TLS (`no pg_hba.conf
/// entry ... SSL encryption`), it tries again in the clear on the same host, and is let in.
/// The second try belongs to the host: a host list with a dead first host still reaches the
/// second host in the clear.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefer_tries_in_the_clear_when_the_primary_accepts_only_hostnossl() {
    let root = TempRoot::new().unwrap();
    let p = tls_primary_with_hba(&root, "hostnossl").await;

    let e = refused(
        connect(&conninfo(&p, REPL_PASSWORD, "sslmode=require")).await,
        "sslmode=require to a hostnossl-only primary",
    );
    assert!(e.contains("no pg_hba.conf entry"), "{e}");

    for extra in ["sslmode=prefer", ""] {
        let mut conn = connect(&conninfo(&p, REPL_PASSWORD, extra))
            .await
            .unwrap_or_else(|e| panic!("{extra:?}: {e}\n{}", p.log_tail(10)));
        assert!(!probe_uses_tls(&p).await, "{extra:?} is in, but over TLS?");
        conn.terminate().await;
    }

    let dead = free_port();
    let two = format!(
        "host=127.0.0.1,127.0.0.1 port={dead},{} user={STANDBY_USER} password={REPL_PASSWORD} \
         sslmode=prefer connect_timeout=10 target_session_attrs=read-write",
        p.port()
    );
    let mut conn = connect(&two)
        .await
        .unwrap_or_else(|e| panic!("two hosts: {e}"));
    assert_eq!(conn.server.index, 1);
    assert!(!probe_uses_tls(&p).await);
    conn.terminate().await;
}

/// A wrong password is refused whatever the fallback does: the second try (libpq makes one
/// after any refusal during authentication) cannot turn it into a connection, and the error
/// still names the password, also where the other transport's refusal is a pg_hba one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_refused_naming_the_password() {
    let root = TempRoot::new().unwrap();
    let p = tls_primary_with_hba(&root, "hostssl").await;

    // allow: in the clear the pg_hba refusal, then with TLS the password's.
    // prefer: with TLS the password's refusal, then in the clear the pg_hba one.
    for mode in ["allow", "prefer"] {
        let e = refused(
            connect(&conninfo(&p, "wrong", &format!("sslmode={mode}"))).await,
            &format!("hostssl only, sslmode={mode}, wrong password"),
        );
        assert!(e.contains(PASSWORD_FAILED), "sslmode={mode}: {e}");
    }

    switch_hba(&p, "hostnossl", "sslmode=disable").await;

    // prefer: with TLS the pg_hba refusal, then in the clear the password's.
    // allow: in the clear the password's refusal, then with TLS the pg_hba one.
    for mode in ["prefer", "allow"] {
        let e = refused(
            connect(&conninfo(&p, "wrong", &format!("sslmode={mode}"))).await,
            &format!("hostnossl only, sslmode={mode}, wrong password"),
        );
        assert!(e.contains(PASSWORD_FAILED), "sslmode={mode}: {e}");
    }

    switch_hba(&p, "host", "sslmode=require").await;
    // Both transports allowed: both tries are refused for the password.
    for mode in ["prefer", "allow"] {
        let e = refused(
            connect(&conninfo(&p, "wrong", &format!("sslmode={mode}"))).await,
            &format!("host, sslmode={mode}, wrong password"),
        );
        assert!(e.contains(PASSWORD_FAILED), "sslmode={mode}: {e}");
    }
}
