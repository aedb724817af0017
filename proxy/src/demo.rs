//! placeholder
pub async fn run(_s: u64) -> anyhow::Result<()> {
    anyhow::bail!("demo not built yet")
}
