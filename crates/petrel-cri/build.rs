//! Generates the CRI `runtime.v1` client from the vendored `proto/api.proto`.
//!
//! `protox` parses the .proto in Rust, so building needs no system `protoc`; the
//! generated code is never committed, so it cannot drift from the vendored file.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/api.proto");
    let fds = protox::compile(["api.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(true)
        .btree_map(".")
        .compile_fds(fds)?;
    Ok(())
}
