//! Wire types of the Istio ambient APIs, generated from `proto/` at build time.
//!
//! Field numbers match Istio's so that every Ambit component interoperates with its
//! Istio counterpart. Conversion into validated internal types happens in the crates
//! that consume these messages; nothing here is trusted.

#![allow(clippy::all, missing_docs, rust_2018_idioms)]

/// `istio.workload`: Address, Workload, Service.
pub mod workload {
    include!(concat!(env!("OUT_DIR"), "/istio.workload.rs"));

    /// ZDS: the node agent ⇄ node proxy protocol.
    pub mod zds {
        include!(concat!(env!("OUT_DIR"), "/istio.workload.zds.rs"));
    }
}

/// `istio.security`: L4 Authorization.
pub mod security {
    include!(concat!(env!("OUT_DIR"), "/istio.security.rs"));
}

/// `istio.v1.auth`: the certificate service.
pub mod ca {
    include!(concat!(env!("OUT_DIR"), "/istio.v1.auth.rs"));
}

/// `ambit.waypoint.v1`: the waypoint's configuration (Destination, Policy), Ambit's own.
pub use self::ambit::waypoint::v1 as waypoint;

/// The generated module tree of package `ambit.waypoint.v1` (its references to `istio.workload`
/// resolve through [`istio`]).
#[doc(hidden)]
pub mod ambit {
    pub mod waypoint {
        pub mod v1 {
            include!(concat!(env!("OUT_DIR"), "/ambit.waypoint.v1.rs"));
        }
    }
}

/// Package paths as the code generated for other packages names them.
#[doc(hidden)]
pub mod istio {
    pub use crate::workload;
}

/// `envoy.service.discovery.v3`: delta ADS.
pub mod xds {
    include!(concat!(env!("OUT_DIR"), "/envoy.service.discovery.v3.rs"));
}

/// `perftools.profiles`: the pprof profile format (CPU profiles of `/debug/pprof/profile`).
pub mod pprof {
    include!(concat!(env!("OUT_DIR"), "/perftools.profiles.rs"));
}

/// xDS type URLs of the resources Ambit serves and consumes.
pub mod type_url {
    /// `istio.workload.Address`.
    pub const ADDRESS: &str = "type.googleapis.com/istio.workload.Address";
    /// `istio.security.Authorization`.
    pub const AUTHORIZATION: &str = "type.googleapis.com/istio.security.Authorization";
    /// `ambit.waypoint.v1.Destination`.
    pub const WAYPOINT_DESTINATION: &str = "type.googleapis.com/ambit.waypoint.v1.Destination";
    /// `ambit.waypoint.v1.Policy`.
    pub const WAYPOINT_POLICY: &str = "type.googleapis.com/ambit.waypoint.v1.Policy";
}

#[cfg(test)]
mod tests {
    use super::workload::zds::*;
    use prost::Message;

    // Byte-for-byte examples from the ZDS spec.
    #[test]
    fn zds_golden_bytes() {
        let hello = ZdsHello { version: Version::V1 as i32 };
        assert_eq!(hello.encode_to_vec(), [0x08, 0x01]);
        let snap =
            WorkloadRequest { payload: Some(workload_request::Payload::SnapshotSent(SnapshotSent {})) };
        assert_eq!(snap.encode_to_vec(), [0x1a, 0x00]);
        let del = WorkloadRequest {
            payload: Some(workload_request::Payload::Del(DelWorkload { uid: "u1".into() })),
        };
        assert_eq!(del.encode_to_vec(), [0x12, 0x04, 0x12, 0x02, 0x75, 0x31]);
        let keep = WorkloadRequest {
            payload: Some(workload_request::Payload::Keep(KeepWorkload { uid: "u1".into() })),
        };
        assert_eq!(keep.encode_to_vec(), [0x2a, 0x04, 0x0a, 0x02, 0x75, 0x31]);
        let add = WorkloadRequest {
            payload: Some(workload_request::Payload::Add(AddWorkload {
                uid: "u1".into(),
                workload_info: Some(WorkloadInfo {
                    name: "n".into(),
                    namespace: "ns".into(),
                    service_account: "sa".into(),
                }),
            })),
        };
        assert_eq!(
            add.encode_to_vec(),
            [
                0x0a, 0x11, 0x0a, 0x02, 0x75, 0x31, 0x12, 0x0b, 0x0a, 0x01, 0x6e, 0x12, 0x02, 0x6e, 0x73,
                0x1a, 0x02, 0x73, 0x61
            ]
        );
        let ack =
            WorkloadResponse { payload: Some(workload_response::Payload::Ack(Ack { error: "e".into() })) };
        assert_eq!(ack.encode_to_vec(), [0x0a, 0x03, 0x0a, 0x01, 0x65]);
        let ok = WorkloadResponse { payload: Some(workload_response::Payload::Ack(Ack::default())) };
        assert_eq!(ok.encode_to_vec(), [0x0a, 0x00]);
    }

    // pprof's documented field numbers, checked on the wire.
    #[test]
    fn pprof_field_numbers() {
        use crate::pprof::*;
        let sample = Sample {
            location_id: vec![1, 2],
            value: vec![5],
            label: vec![Label { key: 1, str: 2, num: 3, num_unit: 4 }],
        };
        assert_eq!(
            sample.encode_to_vec(),
            [
                0x0a, 0x02, 0x01, 0x02, 0x12, 0x01, 0x05, 0x1a, 0x08, 0x08, 0x01, 0x10, 0x02, 0x18, 0x03,
                0x20, 0x04
            ]
        );
        let location = Location {
            id: 1,
            mapping_id: 2,
            address: 3,
            line: vec![Line { function_id: 4, line: 5, column: 6 }],
            is_folded: true,
        };
        assert_eq!(
            location.encode_to_vec(),
            [0x08, 0x01, 0x10, 0x02, 0x18, 0x03, 0x22, 0x06, 0x08, 0x04, 0x10, 0x05, 0x18, 0x06, 0x28, 0x01]
        );
        let function = Function { id: 1, name: 2, system_name: 3, filename: 4, start_line: 5 };
        assert_eq!(function.encode_to_vec(), [0x08, 0x01, 0x10, 0x02, 0x18, 0x03, 0x20, 0x04, 0x28, 0x05]);
        let mapping = Mapping {
            id: 1,
            memory_start: 2,
            memory_limit: 3,
            file_offset: 4,
            filename: 5,
            build_id: 6,
            has_functions: true,
            has_filenames: true,
            has_line_numbers: true,
            has_inline_frames: true,
        };
        assert_eq!(
            mapping.encode_to_vec(),
            [
                0x08, 0x01, 0x10, 0x02, 0x18, 0x03, 0x20, 0x04, 0x28, 0x05, 0x30, 0x06, 0x38, 0x01, 0x40,
                0x01, 0x48, 0x01, 0x50, 0x01
            ]
        );
        let profile = Profile {
            sample_type: vec![ValueType { r#type: 1, unit: 2 }],
            string_table: vec![String::new(), "a".into()],
            drop_frames: 1,
            keep_frames: 1,
            time_nanos: 7,
            duration_nanos: 8,
            period_type: Some(ValueType { r#type: 1, unit: 1 }),
            period: 3,
            comment: vec![1],
            default_sample_type: 1,
            doc_url: "u".into(),
            ..Default::default()
        };
        assert_eq!(
            profile.encode_to_vec(),
            [
                0x0a, 0x04, 0x08, 0x01, 0x10, 0x02, // 1 sample_type
                0x32, 0x00, 0x32, 0x01, 0x61, // 6 string_table
                0x38, 0x01, 0x40, 0x01, // 7 drop_frames, 8 keep_frames
                0x48, 0x07, 0x50, 0x08, // 9 time_nanos, 10 duration_nanos
                0x5a, 0x04, 0x08, 0x01, 0x10, 0x01, // 11 period_type
                0x60, 0x03, // 12 period
                0x6a, 0x01, 0x01, // 13 comment (packed)
                0x70, 0x01, // 14 default_sample_type
                0x7a, 0x01, 0x75, // 15 doc_url
            ]
        );
        let p = Profile {
            sample: vec![Sample::default()],
            mapping: vec![Mapping::default()],
            location: vec![Location::default()],
            function: vec![Function::default()],
            ..Default::default()
        };
        let tags: Vec<u8> = p.encode_to_vec().chunks(2).map(|c| c[0]).collect();
        assert_eq!(tags, [0x12, 0x1a, 0x22, 0x2a], "sample, mapping, location, function are fields 2 to 5");
    }
}
