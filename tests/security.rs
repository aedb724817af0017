//! Authentication and TLS: SCRAM toward standbys, TLS toward standbys, mutual TLS on the link,
//! TLS toward the primary.
#![deny(clippy::undocumented_unsafe_blocks)]

mod common;

use common::*;
use std::time::Duration;
use walrelay_harness::certs::{Ca, CertFiles};
use walrelay_harness::cluster::{
    free_port, wait_until, Cluster, PrimaryOpts, StandbyOpts, TempRoot,
};

async fn primary(root: &TempRoot, extra: Vec<(String, String)>) -> Cluster {
    let opts = PrimaryOpts {
        extra_conf: extra,
        ..Default::default()
    };
    let p = Cluster::init_primary(&install(), root, "primary", &opts).unwrap();
    p.start().await.unwrap();
    p.create_replication_user(REPL_PASSWORD).await.unwrap();
    p
}

fn repl_conninfo(port: u16, user: &str) -> String {
    format!("host=127.0.0.1 port={port} user={user} replication=true sslmode=disable")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scram_refuses_wrong_passwords_and_unknown_users() {
    let root = TempRoot::new().unwrap();
    let p = primary(&root, vec![]).await;
    let (up, down) = (free_port(), free_port());
    let relay = Relay::start(
        root.path(),
        "relay",
        &both_halves_toml(&p, up, down, up, "", ""),
        Some(down),
        Some(up),
    );

    let (ok, _, err) = psql_repl(
        &p,
        &repl_conninfo(down, STANDBY_USER),
        "wrong",
        "IDENTIFY_SYSTEM",
    );
    assert!(
        !ok && err.contains(&format!(
            "password authentication failed for user \"{STANDBY_USER}\""
        )),
        "{err}"
    );
    let (ok, _, err) = psql_repl(
        &p,
        &repl_conninfo(down, "nobody"),
        STANDBY_PASSWORD,
        "IDENTIFY_SYSTEM",
    );
    assert!(
        !ok && err.contains("password authentication failed for user \"nobody\""),
        "{err}"
    );

    // A user name is logged with its control characters escaped: an unknown one with a
    // newline starts no log line of the client's making.
    let (ok, _, err) = psql_repl(
        &p,
        &format!("host=127.0.0.1 port={down} user='nobody\nFORGED-USER' replication=true sslmode=disable"),
        STANDBY_PASSWORD,
        "IDENTIFY_SYSTEM",
    );
    assert!(
        !ok && err.contains("password authentication failed"),
        "{err}"
    );
    let log = relay.log_text();
    assert!(log.contains("nobody\\nFORGED-USER"), "{log}");
    let forged: Vec<&str> = log.lines().filter(|l| l.starts_with("FORGED")).collect();
    assert!(forged.is_empty(), "{forged:?}");

    // The right password works, and the answer is the primary's own system identifier.
    let (ok, out, err) = psql_repl(
        &p,
        &repl_conninfo(down, STANDBY_USER),
        STANDBY_PASSWORD,
        "IDENTIFY_SYSTEM",
    );
    assert!(ok, "{err}");
    let sysid = p
        .query_one_string("select system_identifier::text from pg_control_system()")
        .await
        .unwrap();
    assert!(
        out.starts_with(&format!("{sysid}|1|")),
        "IDENTIFY_SYSTEM answered {out:?}, primary's sysid is {sysid}"
    );

    // Whatever an authenticated client names itself, its log lines stay one line each: the
    // text log escapes line breaks in any event.
    let (ok, _, err) = psql_repl(
        &p,
        &format!(
            "{} application_name='app\nFORGED-APP'",
            repl_conninfo(down, STANDBY_USER)
        ),
        STANDBY_PASSWORD,
        "IDENTIFY_SYSTEM",
    );
    assert!(ok, "{err}");
    let log = relay.log_text();
    assert!(log.contains("app\\nFORGED-APP"), "{log}");
    let forged: Vec<&str> = log.lines().filter(|l| l.starts_with("FORGED")).collect();
    assert!(forged.is_empty(), "{forged:?}");
    relay.assert_no_panic();
}

/// Writes a TOML for one half with TLS files from `dir`.
fn upstream_only(p: &Cluster, up: u16, primary_conninfo_extra: &str, link: &str) -> String {
    format!(
        "[upstream]\nprimary = \"host=127.0.0.1 port={} user={STANDBY_USER} password={REPL_PASSWORD} {primary_conninfo_extra}\"\nlisten = \"127.0.0.1:{up}\"\n\n[link]\n{link}\n",
        p.port()
    )
}

fn downstream_only(
    dir: &std::path::Path,
    down: u16,
    up: u16,
    link: &str,
    downstream_extra: &str,
) -> String {
    format!(
        "[downstream]\nlisten = \"127.0.0.1:{down}\"\nupstream = \"localhost:{up}\"\nauth = \"scram-sha-256\"\nusers = {{ {STANDBY_USER} = \"{}\" }}\nspool_dir = \"{}\"\n{downstream_extra}\n\n[link]\n{link}\nconnect_timeout_secs = 3\n",
        walrelay_pgwire::scram::new_verifier(STANDBY_PASSWORD),
        dir.join(format!("spool-{down}")).display()
    )
}

/// A downstream (`name`) of the upstream on port `up`, with link TLS from `ca` and `cert`,
/// and a standby's IDENTIFY_SYSTEM through it: (success, stdout, stderr).
fn downstream_identifies(
    p: &Cluster,
    dir: &std::path::Path,
    up: u16,
    name: &str,
    ca: &std::path::Path,
    cert: &CertFiles,
) -> (Relay, (bool, String, String)) {
    let down = free_port();
    let link = tls_link(ca, cert);
    let relay = Relay::start(
        dir,
        name,
        &downstream_only(dir, down, up, &link, ""),
        Some(down),
        None,
    );
    let conninfo = repl_conninfo(down, STANDBY_USER);
    let r = psql_repl(p, &conninfo, STANDBY_PASSWORD, "IDENTIFY_SYSTEM");
    (relay, r)
}

fn tls_link(ca: &std::path::Path, cert: &CertFiles) -> String {
    format!(
        "tls_cert = \"{}\"\ntls_key = \"{}\"\ntls_ca = \"{}\"",
        cert.cert.display(),
        cert.key.display(),
        ca.display()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_link_refuses_peers_without_a_valid_client_certificate() {
    let root = TempRoot::new().unwrap();
    let dir = root.path();
    let p = primary(&root, vec![]).await;
    let ca = Ca::new("walrelay test CA").unwrap();
    let rogue = Ca::new("rogue CA").unwrap();
    let ca_pem = ca.write_ca(dir, "ca").unwrap();
    let server = ca
        .issue(dir, "upstream", &["localhost", "127.0.0.1"])
        .unwrap();
    let good_client = ca.issue(dir, "downstream", &["downstream"]).unwrap();
    let rogue_client = rogue.issue(dir, "rogue", &["downstream"]).unwrap();

    let up = free_port();
    let upstream = Relay::start(
        dir,
        "upstream",
        &upstream_only(&p, up, "sslmode=disable", &tls_link(&ca_pem, &server)),
        None,
        Some(up),
    );

    for (name, client, should_work) in [
        ("good", &good_client, true),
        ("rogue", &rogue_client, false),
    ] {
        let (relay, (ok, out, err)) =
            downstream_identifies(&p, dir, up, &format!("downstream-{name}"), &ca_pem, client);
        assert_eq!(
            ok,
            should_work,
            "{name}: stdout {out:?} stderr {err:?}\n{}",
            relay.log_text()
        );
        if !should_work {
            assert!(
                err.contains("cannot reach the primary through the upstream"),
                "{name}: {err}"
            );
        }
    }

    // A peer that verifies the upstream but presents no client certificate at all.
    walrelay::tls::install_default_provider();
    let link = walrelay::config::LinkConfig {
        tls_ca: Some(ca_pem.clone()),
        connect_timeout_secs: 3,
        ..Default::default()
    };
    let channel =
        walrelay::link::client_channel(&link, &format!("localhost:{up}").parse().unwrap()).unwrap();
    let mut client = walrelay_proto::link::link_client::LinkClient::new(channel);
    let hello = walrelay_proto::link::ToUpstream {
        msg: Some(walrelay_proto::link::to_upstream::Msg::Hello(
            walrelay_proto::link::Hello {
                protocol_version: walrelay_proto::PROTOCOL_VERSION,
                codec: "zstd".into(),
                ..Default::default()
            },
        )),
    };
    let r = client.stream(tokio_stream::iter(vec![hello])).await;
    assert!(
        r.is_err(),
        "the upstream accepted a link session from a peer without a client certificate"
    );

    // The upstream's certificate renewed in place, by another CA: a reload reads it (as
    // PostgreSQL reads its certificates on SIGHUP), and a downstream that trusts only the new
    // CA gets in.
    let ca2 = Ca::new("walrelay test CA 2").unwrap();
    let ca2_pem = ca2.write_ca(dir, "ca2").unwrap();
    ca2.issue(dir, "upstream", &["localhost", "127.0.0.1"])
        .unwrap();
    upstream.signal(libc::SIGHUP);
    let u = &upstream;
    wait_until(
        "the reload reads the renewed files",
        TIMEOUT,
        || async move {
            Ok(u.log_text().contains(
                "the TLS files of link.tls_cert, link.tls_key changed on disk and were read again",
            ))
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", upstream.log_text()));
    let (relay, (ok, out, err)) =
        downstream_identifies(&p, dir, up, "downstream-renewed", &ca2_pem, &good_client);
    assert!(ok, "stdout {out:?} stderr {err:?}\n{}", relay.log_text());
    // The downstream's client certificate renewed likewise: read again on SIGHUP.
    ca.issue(dir, "downstream", &["downstream"]).unwrap();
    relay.signal(libc::SIGHUP);
    let r = &relay;
    wait_until(
        "the downstream reads its renewed files",
        TIMEOUT,
        || async move { Ok(r.log_text().contains("changed on disk and were read again")) },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", relay.log_text()));
    upstream.assert_no_panic();
    relay.assert_no_panic();
}

/// A primary that serves TLS with a certificate for localhost issued by `ca`, and logs its
/// connections.
async fn tls_primary(root: &TempRoot, ca: &Ca) -> Cluster {
    let dir = root.path();
    let pg_cert = ca
        .issue(dir, "pgserver", &["localhost", "127.0.0.1"])
        .unwrap();
    for f in [&pg_cert.cert, &pg_cert.key] {
        std::os::unix::fs::chown(f, Some(postgres_uid()), None).ok();
        std::fs::set_permissions(f, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    }
    primary(
        root,
        vec![
            ("ssl".into(), "on".into()),
            ("ssl_cert_file".into(), pg_cert.cert.display().to_string()),
            ("ssl_key_file".into(), pg_cert.key.display().to_string()),
            ("log_connections".into(), "on".into()),
        ],
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_toward_standbys_and_toward_the_primary() {
    let root = TempRoot::new().unwrap();
    let dir = root.path();
    let ca = Ca::new("walrelay test CA").unwrap();
    let ca_pem = ca.write_ca(dir, "ca").unwrap();
    let p = tls_primary(&root, &ca).await;
    let standby_cert = ca
        .issue(dir, "standbyside", &["localhost", "127.0.0.1"])
        .unwrap();
    let (up, down) = (free_port(), free_port());
    let toml = both_halves_toml(&p, up, down, up, "", "")
        .replace(
            "sslmode=disable",
            &format!(
                "sslmode=verify-full sslrootcert={} host=localhost",
                ca_pem.display()
            ),
        )
        .replace(
            "[link]",
            &format!(
                "tls_cert = \"{}\"\ntls_key = \"{}\"\n\n[link]",
                standby_cert.cert.display(),
                standby_cert.key.display()
            ),
        );
    let relay = Relay::start(dir, "relay", &toml, Some(down), Some(up));

    // A standby-side client that insists on a verified TLS connection to the downstream.
    let conninfo = format!("host=localhost port={down} user={STANDBY_USER} replication=true sslmode=verify-full sslrootcert={} application_name=tls_probe", ca_pem.display());
    // SHOW goes through the standby's own connection to the primary, so the session lasts
    // until that connection is open: with IDENTIFY_SYSTEM alone (served from the spool) the
    // probe could leave before the upstream opened it, and then it never opened.
    let (ok, out, err) = psql_repl(&p, &conninfo, STANDBY_PASSWORD, "SHOW server_version");
    assert!(
        ok,
        "verify-full TLS to the downstream failed: {out} {err}\n{}",
        relay.log_text()
    );
    // The plaintext attempt is still accepted only if the client allows it; sslmode=require works too.
    let (ok, _, err) = psql_repl(
        &p,
        &format!("host=127.0.0.1 port={down} user={STANDBY_USER} replication=true sslmode=require"),
        STANDBY_PASSWORD,
        "IDENTIFY_SYSTEM",
    );
    assert!(ok, "{err}");
    assert!(
        relay.log_text().contains("tls=true"),
        "the downstream did not log a TLS session"
    );

    // The upstream reached the primary over verified TLS, as the standby (its own connection
    // opens when the standby connects to the downstream).
    let pr = &p;
    wait_until(
        "a TLS replication connection for tls_probe on the primary",
        TIMEOUT,
        || async move {
            let log = std::fs::read_to_string(pr.log_path()).unwrap_or_default();
            Ok(log.lines().any(|l| {
                l.contains("replication connection authorized")
                    && l.contains("application_name=tls_probe")
                    && l.contains("SSL enabled")
            }))
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}:\n{}\n{}", p.log_tail(20), relay.log_text()));
}

/// A standby's own connection to the primary drops the WAL it receives, and reads it in
/// batches with pauses between (`upstream/identity.rs`): over TLS, under a load of about
/// 60 MB of WAL, its walsender still sends everything (`sent_lsn` reaches the load's end)
/// while the standby receives it through the stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standbys_own_tls_connection_keeps_up_with_a_load() {
    let root = TempRoot::new().unwrap();
    let ca = Ca::new("walrelay test CA").unwrap();
    let p = tls_primary(&root, &ca).await;
    let (up, down) = (free_port(), free_port());
    let toml =
        both_halves_toml(&p, up, down, up, "", "").replace("sslmode=disable", "sslmode=require");
    let relay = Relay::start(root.path(), "relay", &toml, Some(down), Some(up));
    let mut sopts = StandbyOpts::new(standby_conninfo(down));
    sopts.application_name = Some("standby1".into());
    let standby = p.basebackup_standby(&root, "standby", &sopts).unwrap();
    standby.start().await.unwrap();
    let sent = "select coalesce((select sent_lsn::text from pg_stat_replication \
                where application_name = 'standby1' and state = 'streaming'), '')";
    let pr = &p;
    wait_until(
        "standby1's own connection streaming",
        TIMEOUT,
        || async move { Ok(!pr.query_one_string(sent).await?.is_empty()) },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", relay.log_text()));
    assert!(
        std::fs::read_to_string(p.log_path())
            .unwrap_or_default()
            .lines()
            .any(|l| l.contains("application_name=standby1") && l.contains("SSL enabled")),
        "standby1's own connection did not use TLS"
    );

    // About 60 MB of WAL.
    p.execute(
        "create table load_t as select g, repeat(md5(g::text), 8) as t \
         from generate_series(1, 200000) g",
    )
    .await
    .unwrap();
    let end = p
        .query_one_string("select pg_current_wal_flush_lsn()::text")
        .await
        .unwrap();
    let caught_up = format!(
        "select coalesce((select (sent_lsn >= '{end}'::pg_lsn)::text from pg_stat_replication \
         where application_name = 'standby1'), 'false')"
    );
    let q = &caught_up;
    let waited = wait_until(
        &format!("standby1's walsender sent up to {end}"),
        Duration::from_secs(15),
        || async move { Ok(pr.query_one_string(q).await? == "true") },
    )
    .await;
    if let Err(e) = waited {
        let at = p.query_one_string(sent).await.unwrap_or_default();
        panic!("{e}: it sent up to {at}\n{}", relay.log_text());
    }
    // And the standby has it all, through the stream.
    let sb = &standby;
    wait_until(&format!("standby replayed up to {end}"), TIMEOUT, || {
        let e = end.clone();
        async move {
            let q = format!("select (pg_last_wal_replay_lsn() >= '{e}'::pg_lsn)::text");
            Ok(sb.query_one_string(&q).await? == "true")
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", standby.log_tail(20)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn link_peer_names_refuse_a_certificate_with_another_name() {
    let root = TempRoot::new().unwrap();
    let dir = root.path();
    let p = primary(&root, vec![]).await;
    let ca = Ca::new("walrelay test CA").unwrap();
    let ca_pem = ca.write_ca(dir, "ca").unwrap();
    let server = ca
        .issue(dir, "upstream", &["localhost", "relay-up.example"])
        .unwrap();
    let dc2 = ca.issue(dir, "dc2", &["relay-down-dc2.example"]).unwrap();
    let other = ca.issue(dir, "other", &["someone-else.example"]).unwrap();

    let up = free_port();
    let upstream = Relay::start(
        dir,
        "upstream",
        &upstream_only(
            &p,
            up,
            "sslmode=disable",
            &format!(
                "{}\npeer_names = [\"relay-down-dc2.example\", \"relay-down-dc3.example\"]",
                tls_link(&ca_pem, &server)
            ),
        ),
        None,
        Some(up),
    );
    // (downstream name, its certificate, peer_names it expects of the upstream, served?)
    let cases = [
        ("dc2", &dc2, "[\"relay-up.example\"]", true),
        ("other", &other, "[]", false),
        ("strict", &dc2, "[\"relay-up-elsewhere.example\"]", false),
    ];
    for (name, cert, expects, should_work) in cases {
        let down = free_port();
        let link = format!("{}\npeer_names = {expects}", tls_link(&ca_pem, cert));
        let relay = Relay::start(
            dir,
            &format!("downstream-{name}"),
            &downstream_only(dir, down, up, &link, ""),
            Some(down),
            None,
        );
        let (ok, out, err) = psql_repl(
            &p,
            &repl_conninfo(down, STANDBY_USER),
            STANDBY_PASSWORD,
            "IDENTIFY_SYSTEM",
        );
        assert_eq!(ok, should_work, "{name}: {out} {err}\n{}", relay.log_text());
        if should_work {
            continue;
        }
        assert!(
            err.contains("cannot reach the primary through the upstream"),
            "{name}: {err}"
        );
        // The refusing end says why, naming the key.
        let refuser = match name {
            "other" => &upstream,
            _ => &relay,
        };
        let text = refuser.log_text();
        wait_until("the refusal in the log", TIMEOUT, || {
            let t = refuser.log_text();
            async move { Ok(t.contains("carries none of link.peer_names")) }
        })
        .await
        .unwrap_or_else(|_| panic!("{name}: no peer_names refusal logged:\n{text}"));
    }
}

/// A link peer that makes the server reset stream after stream for its errors (malformed
/// headers: a connection-specific one) gets a GOAWAY after `link::MAX_LOCAL_ERROR_RESETS`,
/// as hyper's default has it (RUSTSEC-2024-0003), rather than resets for as long as it likes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_peer_that_keeps_erring_is_sent_away() {
    use std::io::{Read, Write};
    let root = TempRoot::new().unwrap();
    let p = primary(&root, Vec::new()).await;
    let up = free_port();
    let relay = Relay::start(
        root.path(),
        "upstream",
        &upstream_only(&p, up, "sslmode=disable", "plaintext = true"),
        None,
        Some(up),
    );
    let mut s = std::net::TcpStream::connect(("127.0.0.1", up)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0".to_vec();
    // HEADERS (END_STREAM | END_HEADERS): :method GET, :scheme http, :path /, then a literal
    // header whose name is upper-case, which HTTP/2 forbids.
    let mut block = vec![0x82u8, 0x86, 0x84, 0x00, 0x0a];
    block.extend_from_slice(b"connection\x01x");
    let n = 2 * walrelay::link::MAX_LOCAL_ERROR_RESETS as u32;
    for i in 0..n {
        out.extend_from_slice(&[0, 0, block.len() as u8, 0x01, 0x05]);
        out.extend_from_slice(&(2 * i + 1).to_be_bytes());
        out.extend_from_slice(&block);
    }
    let writer = {
        let mut w = s.try_clone().unwrap();
        std::thread::spawn(move || {
            let _ = w.write_all(&out);
        })
    };
    let (mut resets, mut goaway) = (0, None);
    let mut head = [0u8; 9];
    while s.read_exact(&mut head).is_ok() {
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let mut payload = vec![0u8; len];
        if s.read_exact(&mut payload).is_err() {
            break;
        }
        match head[3] {
            0x3 => resets += 1,
            0x7 => {
                // Last stream id, then the error code.
                goaway = payload
                    .get(4..8)
                    .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]));
                break;
            }
            _ => {}
        }
    }
    drop(s);
    let _ = writer.join();
    // ENHANCE_YOUR_CALM (0xb), before the server reset every stream the peer asked for.
    assert_eq!(
        goaway,
        Some(0xb),
        "after {resets} streams reset for the peer's errors"
    );
    assert!(
        resets <= walrelay::link::MAX_LOCAL_ERROR_RESETS,
        "{resets} resets before the GOAWAY"
    );
    relay.assert_no_panic();
}
