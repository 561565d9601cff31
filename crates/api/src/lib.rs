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
}
