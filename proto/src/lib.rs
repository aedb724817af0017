//! The walrelay link protocol, generated from `link.proto` (see that file for the message flow).
#![allow(clippy::all)]
pub mod link {
    tonic::include_proto!("walrelay.link.v1");
}

/// Version of the link protocol spoken by this build; both halves must agree.
pub const PROTOCOL_VERSION: u32 = 2;
