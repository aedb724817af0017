//! Logical replication failover (PostgreSQL 17) with the standby behind walrelay (#13): a
//! subscription created through the downstream with `failover = true`, its slot synchronized
//! to a standby streaming through the relay (the slot-sync worker's SQL session tunnelled),
//! and after the primary stops and the standby is promoted, the subscription continues from
//! the synchronized slot on the promoted standby without losing or repeating a change.
#![deny(clippy::undocumented_unsafe_blocks)]

mod common;

use common::split::{Split, SplitOpts};
use common::*;
use walrelay_harness::cluster::{wait_until, Cluster};

const ROWS: &str = "select coalesce(string_agg(id || ':' || v, ',' order by id, v), '') from items";

/// `id:v` for each id of `ids`, as [`ROWS`] lists them.
fn rows(ids: impl Iterator<Item = i32>) -> String {
    ids.map(|i| format!("{i}:r{i}"))
        .collect::<Vec<_>>()
        .join(",")
}

async fn insert(c: &Cluster, from: i32, to: i32) {
    c.execute(&format!(
        "insert into items select g, 'r' || g from generate_series({from}, {to}) g"
    ))
    .await
    .unwrap();
}

async fn lsn_of(c: &Cluster, sql: &str) -> u64 {
    parse_lsn(&c.query_one_string(sql).await.unwrap())
}

/// The slot `sub` on `c`: `confirmed_flush_lsn` and whether it is ready for failover (as the
/// PostgreSQL documentation checks it: synchronized, not temporary, not invalidated).
async fn slot_state(c: &Cluster) -> Result<(u64, bool), walrelay_harness::cluster::ClusterError> {
    let s = c.query_one_string("select coalesce((select confirmed_flush_lsn::text || ' ' || (synced and not temporary and invalidation_reason is null)::text from pg_replication_slots where slot_name = 'sub'), '0/0 false')").await?;
    let (lsn, ready) = s.split_once(' ').unwrap_or(("0/0", "false"));
    Ok((parse_lsn(lsn), ready == "true"))
}

/// The primary (PG 17) with a physical slot for the standby, the standby streaming through
/// the relay with `sync_replication_slots = on`, and `synchronized_standby_slots` naming its
/// slot (set after the standby's base backup, which would otherwise copy it).
async fn primary_and_syncing_standby() -> (Split, Cluster) {
    let env = Split::new(SplitOpts {
        primary: walrelay_harness::cluster::PrimaryOpts {
            wal_level: "logical".into(),
            ..Default::default()
        },
        major: Some(17),
        downstream_extra: "allow_slot_commands = true\n".into(),
        ..Default::default()
    })
    .await;
    let p = &env.primary;
    p.create_physical_slot("sb1").await.unwrap();
    let standby = env.slot_sync_standby("sb1").await;
    p.execute("alter system set synchronized_standby_slots = 'sb1'")
        .await
        .unwrap();
    p.execute("select pg_reload_conf()").await.unwrap();
    (env, standby)
}

/// A PG 17 subscriber with a subscription through the downstream on publication `pub` of
/// table `items`, its slot a failover slot on the primary, the table copy finished.
async fn subscribe_through_the_relay(env: &Split) -> Cluster {
    let p = &env.primary;
    // No primary key: a change delivered twice would show as a second row.
    p.execute("create table items(id int, v text); create publication pub for table items; grant select on items to replicator").await.unwrap();
    insert(p, 1, 3).await;
    let sub =
        Cluster::init_primary(p.install(), &env.root, "subscriber", &Default::default()).unwrap();
    sub.start().await.unwrap();
    sub.execute("create table items(id int, v text)")
        .await
        .unwrap();
    let through_relay = format!(
        "host=127.0.0.1 port={} user={STANDBY_USER} password={STANDBY_PASSWORD} dbname=postgres",
        env.down_port
    );
    sub.execute(&format!(
        "create subscription sub connection '{through_relay}' publication pub with (failover = true)"
    ))
    .await
    .unwrap();
    let failover = "select failover::text from pg_replication_slots where slot_name = 'sub'";
    assert_eq!(p.query_one_string(failover).await.unwrap(), "true");
    let copying = "select count(*)::text from pg_subscription_rel where srsubstate <> 'r'";
    let s = &sub;
    wait_until("the table copy to finish", TIMEOUT, || async move {
        Ok(s.query_one_string(copying).await? == "0")
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", sub.log_tail(30)));
    sub
}

/// Waits until `sub` has exactly the rows `want` ([`ROWS`]); on timeout panics with what it
/// has and the logs of `sub` and `publisher`.
async fn wait_rows(what: &str, sub: &Cluster, publisher: &Cluster, want: &str) {
    let r = wait_until(what, TIMEOUT, || async {
        Ok(sub.query_one_string(ROWS).await? == want)
    })
    .await;
    if let Err(e) = r {
        let got = sub.query_one_string(ROWS).await.unwrap_or_default();
        panic!(
            "{e}\nsubscriber has {got}\nsubscriber log:\n{}\npublisher log:\n{}",
            sub.log_tail(30),
            publisher.log_tail(30)
        );
    }
}

/// Waits until the primary's slot `sub` confirmed the primary's WAL up to now and the
/// standby's synchronized copy of it is ready for failover at that position or later;
/// returns the confirmed position.
async fn wait_ready_for_failover(env: &Split, standby: &Cluster) -> u64 {
    let p = &env.primary;
    let target = env.lsn().await;
    wait_until(
        "the primary's slot to be confirmed",
        TIMEOUT,
        || async move { Ok(slot_state(p).await?.0 >= target) },
    )
    .await
    .unwrap();
    let confirmed = slot_state(p).await.unwrap().0;
    wait_until(
        "the synced slot to be ready for failover",
        TIMEOUT,
        || async move {
            p.execute("select pg_log_standby_snapshot()").await?;
            let (lsn, ready) = slot_state(standby).await?;
            Ok(ready && lsn >= confirmed)
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nstandby log:\n{}", standby.log_tail(30)));
    confirmed
}

/// With the subscription disabled, writes rows 11..=15 on the primary and waits until the
/// standby replayed them: changes in the WAL after the synced slot's position that the
/// subscriber has not received. Returns the primary's WAL end.
async fn changes_the_subscriber_misses(env: &Split, sub: &Cluster, standby: &Cluster) -> u64 {
    let p = &env.primary;
    sub.execute("alter subscription sub disable").await.unwrap();
    let active = "select active::text from pg_replication_slots where slot_name = 'sub'";
    wait_until(
        "the subscription's walsender to end",
        TIMEOUT,
        || async move { Ok(p.query_one_string(active).await? == "false") },
    )
    .await
    .unwrap();
    insert(p, 11, 15).await;
    let end = lsn_of(p, "select pg_current_wal_flush_lsn()::text").await;
    let replayed = "select pg_last_wal_replay_lsn()::text";
    wait_until(
        "the standby to replay the last changes",
        TIMEOUT,
        || async move { Ok(lsn_of(standby, replayed).await >= end) },
    )
    .await
    .unwrap();
    end
}

/// Changes flow to a PG 17 subscriber through the relay on a failover slot, which the standby
/// behind the relay synchronizes; changes written while the subscription is disabled reach
/// the standby but not the subscriber. The primary stops, the standby is promoted, the
/// subscription is pointed at it and enabled, more changes are written there: the subscriber
/// then has every row exactly once — those it had, those written before the failover that it
/// had not received (so the synchronized slot was not ahead of the subscriber), and those
/// written on the promoted standby.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_continues_on_the_promoted_standby_from_the_synced_slot() {
    let (env, standby) = primary_and_syncing_standby().await;
    let p = &env.primary;
    let sub = subscribe_through_the_relay(&env).await;
    insert(p, 4, 10).await;
    let all10 = rows(1..=10);
    wait_rows("changes to reach the subscriber", &sub, p, &all10).await;
    let confirmed = wait_ready_for_failover(&env, &standby).await;
    let end = changes_the_subscriber_misses(&env, &sub, &standby).await;
    assert_eq!(sub.query_one_string(ROWS).await.unwrap(), all10);
    let synced_at = slot_state(&standby).await.unwrap().0;
    eprintln!("subscriber confirmed {confirmed:X}; synced slot at {synced_at:X}; WAL end before the failover {end:X}");
    assert!(
        synced_at < end,
        "the synced slot ({synced_at:X}) should be before the undelivered changes ({end:X})"
    );

    // Failover: the primary stops, the standby is promoted, the subscription follows it.
    p.stop().await.unwrap();
    standby
        .execute("select pg_promote(true, 60)")
        .await
        .unwrap();
    insert(&standby, 16, 20).await;
    let direct = format!(
        "host=127.0.0.1 port={} user={STANDBY_USER} password={REPL_PASSWORD} dbname=postgres",
        standby.port()
    );
    sub.execute(&format!("alter subscription sub connection '{direct}'"))
        .await
        .unwrap();
    sub.execute("alter subscription sub enable").await.unwrap();
    let all20 = rows(1..=20);
    wait_rows("every change after the failover", &sub, &standby, &all20).await;
    assert_eq!(
        standby.query_one_string(ROWS).await.unwrap(),
        all20,
        "the promoted standby has every row once"
    );
    // The subscription's sessions and the slot-sync worker's went through the relay.
    let log = env.downstream.log_text();
    for mode in ["mode=Logical", "mode=Sql"] {
        assert!(
            log.lines()
                .any(|l| l.contains("session goes through a tunnel") && l.contains(mode)),
            "no {mode} tunnel in the downstream's log"
        );
    }
    env.downstream.assert_no_panic();
    env.upstream.assert_no_panic();
}
