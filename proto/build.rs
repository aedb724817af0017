//! Compiles `link.proto` with protox (pure Rust), so building needs no system `protoc`.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=link.proto");
    let fds = protox::compile(["link.proto"], ["."])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .bytes(".")
        .compile_fds(fds)?;
    Ok(())
}
