//! Compiles `../proto/inventory.proto` with protox (pure Rust): the reference
//! inventory server, and a client with the calls the order service makes
//! (reserve, stock) that the production client does not carry.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=../proto/inventory.proto");
    let fds = protox::compile(["inventory.proto"], ["../proto"])?;
    tonic_prost_build::configure().compile_fds(fds)?;
    Ok(())
}
