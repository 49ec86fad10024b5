//! Compiles `proto/inventory.proto` with protox (pure Rust), so building
//! needs no system `protoc`. The service only calls the inventory, so only
//! the client is generated; the reference server lives in the tools crate.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/inventory.proto");
    let fds = protox::compile(["inventory.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_server(false)
        .compile_fds(fds)?;
    Ok(())
}
