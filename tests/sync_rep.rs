//! Synchronous replication through the relay: a commit is acknowledged only after the real
//! standby flushed it, so commits wait while the link is cut and complete when it returns.
#![deny(clippy::undocumented_unsafe_blocks)]

mod common;

use common::*;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_wait_while_the_link_is_cut() {
    let env = env(EnvOpts {
        cuttable_link: true,
        ..Default::default()
    })
    .await;
    env.primary
        .execute("alter system set synchronous_standby_names = 'standby1'")
        .await
        .unwrap();
    env.primary
        .execute("select pg_reload_conf()")
        .await
        .unwrap();
    env.primary
        .execute("create table sync_t(x int)")
        .await
        .unwrap();
    let state = env
        .primary
        .query_one_string(
            "select sync_state from pg_stat_replication where application_name = 'standby1'",
        )
        .await
        .unwrap();
    assert_eq!(state, "sync");

    // Link up: a commit completes.
    tokio::time::timeout(
        Duration::from_secs(30),
        env.primary.execute("insert into sync_t values (1)"),
    )
    .await
    .expect("commit with the link up")
    .unwrap();

    // Link cut: a commit waits for the standby.
    env.cut.as_ref().unwrap().cut();
    let client = env.primary.connect().await.unwrap();
    let mut pending = tokio::spawn(async move {
        client
            .execute("insert into sync_t values (2)", &[])
            .await
            .map(|_| ())
    });
    let waited = tokio::time::timeout(Duration::from_secs(4), &mut pending).await;
    assert!(
        waited.is_err(),
        "a synchronous commit completed while the link was cut"
    );
    let waiting = env
        .primary
        .query_one_string(
            "select count(*)::text from pg_stat_activity where wait_event = 'SyncRep'",
        )
        .await
        .unwrap();
    assert_eq!(waiting, "1", "the commit should wait in SyncRep");

    // Link back: the standby reconnects by itself and the commit completes.
    env.cut.as_ref().unwrap().restore();
    tokio::time::timeout(TIMEOUT, pending)
        .await
        .expect("commit after the link returned")
        .unwrap()
        .unwrap();
    env.wait_caught_up().await;
    assert_eq!(
        env.standby
            .query_one_string("select string_agg(x::text, ',' order by x) from sync_t")
            .await
            .unwrap(),
        "1,2"
    );
    env.relay.assert_no_panic();
}
