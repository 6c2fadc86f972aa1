//! Generates the ONNX protobuf types from the vendored `proto/onnx.proto` with protox (a protobuf
//! compiler in pure Rust, so no `protoc` binary is needed) and prost-build.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/onnx.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    prost_build::Config::new().compile_fds(descriptors)?;
    Ok(())
}
