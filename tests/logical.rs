//! wal_level=logical through the relay: every record kind logical decoding adds (old tuples of
//! REPLICA IDENTITY FULL, new tuples logged whole, running-xacts snapshots, ...) reaches the
//! standby exactly, and logical decoding on a PostgreSQL 16+ standby behind the relay decodes
//! the primary's changes.
#![deny(clippy::undocumented_unsafe_blocks)]

mod common;

use common::*;
use std::time::Duration;
use walrelay_harness::cluster::{Cluster, PrimaryOpts};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logical_slot_on_a_pg16_standby_behind_the_relay_decodes_the_primarys_changes() {
    let env = env(EnvOpts {
        major: Some(16),
        primary: PrimaryOpts {
            wal_level: "logical".into(),
            ..Default::default()
        },
        standby_extra_conf: vec![("hot_standby_feedback".into(), "on".into())],
        ..Default::default()
    })
    .await;
    let (primary, standby) = (&env.primary, &env.standby);
    pgbench(primary, &["-i", "-s", "1", "-q", "postgres"]);
    // Full pages (fillfactor 100): updated rows move to other pages and are logged whole.
    primary
        .execute(
            "create table movers (id int primary key, n int not null default 0, payload text) \
               with (fillfactor = 100);
             alter table movers replica identity full;
             insert into movers select g, 0, repeat(md5(g::text), 6) from generate_series(1, 2000) g;
             checkpoint;",
        )
        .await
        .unwrap();
    env.wait_caught_up().await;

    create_slot_on_standby(primary, standby).await;
    primary
        .execute(
            "update movers set n = n + 1 where id % 3 = 0;
             delete from movers where id % 7 = 0;
             insert into movers values (100001, 5, 'after the slot');",
        )
        .await
        .unwrap();
    pgbench(primary, &["-c", "2", "-t", "200", "postgres"]);
    env.wait_caught_up().await;

    let count = |filter: &str| {
        format!("count(*) filter (where data like 'table public.movers: {filter}')::text")
    };
    let sql = format!(
        "select {} || '/' || {} || '/' || {} || '/' || {} from pg_logical_slot_get_changes('on_standby', NULL, NULL)",
        count("UPDATE:%"),
        count("DELETE:%"),
        count("INSERT:%after the slot%"),
        // REPLICA IDENTITY FULL: the whole old row, then the new one.
        count("UPDATE: old-key: id[integer]:3 n[integer]:0 payload[text]:''%'' new-tuple: id[integer]:3 n[integer]:1 %"),
    );
    let got = standby.query_one_string(&sql).await.unwrap();
    assert_eq!(
        got, "666/285/1/1",
        "updates/deletes/inserts/row 3 decoded on the standby"
    );

    assert_eq!(
        tables_digest(primary, &["movers"]).await,
        tables_digest(standby, &["movers"]).await
    );
    let n = env.assert_identical().await;
    assert!(n >= 1, "no complete segment to compare");
    env.relay.assert_no_panic();
}

/// A logical slot on the standby: its creation waits for a running-xacts record from the
/// primary, which pg_log_standby_snapshot() writes at once.
async fn create_slot_on_standby(primary: &Cluster, standby: &Cluster) {
    let create =
        standby.execute("select pg_create_logical_replication_slot('on_standby', 'test_decoding')");
    let nudge = async {
        loop {
            let _ = primary.execute("select pg_log_standby_snapshot()").await;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    };
    tokio::time::timeout(TIMEOUT, async {
        tokio::select! {
            r = create => r.expect("creating a logical slot on the standby"),
            () = nudge => unreachable!(),
        }
    })
    .await
    .expect("the logical slot on the standby was not created in time");
}
