//! Generates the OpAMP messages from the vendored `proto/opamp.proto`
//! (opamp-spec v0.18.0, see `proto/README.md`).
//!
//! `protox` parses the .proto in Rust, so building needs no system `protoc`;
//! the generated code is never committed, so it cannot drift from the
//! vendored files.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/opamp.proto");
    println!("cargo:rerun-if-changed=proto/anyvalue.proto");
    let fds = protox::compile(["opamp.proto"], ["proto"])?;
    // Messages only: OpAMP is not gRPC, it frames these itself over
    // WebSocket or plain HTTP.
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(false)
        .btree_map(".")
        .compile_fds(fds)?;
    Ok(())
}
