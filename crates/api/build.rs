//! Compiles `proto/` with protox (pure Rust), so no `protoc` binary is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../proto");
    let files = [
        "workload.proto",
        "authorization.proto",
        "zds.proto",
        "ca.proto",
        "xds.proto",
        "profile.proto",
        "waypoint.proto",
    ];
    for f in files {
        println!("cargo:rerun-if-changed={dir}/{f}");
    }
    let fds = protox::compile(files, [dir])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // A map field encodes in its iteration order; a BTreeMap makes equal workloads encode
        // to equal bytes, so content-hash xDS versions agree across restarts and replicas.
        .btree_map(".istio.workload.Workload.services")
        .btree_map(".ambit.waypoint.v1.Endpoint.ports")
        .compile_fds(fds)?;
    Ok(())
}
