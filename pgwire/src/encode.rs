//! Encoders of backend messages (server → client) and frontend messages (client → server).

use super::*;

/// Appends a tagged message whose body is produced by `body`.
pub fn tagged(out: &mut BytesMut, tag: u8, body: impl FnOnce(&mut BytesMut)) {
    out.put_u8(tag);
    let at = out.len();
    out.put_u32(0);
    body(out);
    let len = (out.len() - at) as u32;
    out[at..at + 4].copy_from_slice(&len.to_be_bytes());
}

fn cstr(out: &mut BytesMut, s: &str) {
    out.put_slice(s.as_bytes());
    out.put_u8(0);
}

pub fn auth_ok(out: &mut BytesMut) {
    tagged(out, b'R', |b| b.put_u32(0));
}
pub fn auth_sasl(out: &mut BytesMut, mechanisms: &[&str]) {
    tagged(out, b'R', |b| {
        b.put_u32(10);
        for m in mechanisms {
            cstr(b, m);
        }
        b.put_u8(0);
    });
}
pub fn auth_sasl_continue(out: &mut BytesMut, data: &[u8]) {
    tagged(out, b'R', |b| {
        b.put_u32(11);
        b.put_slice(data);
    });
}
pub fn auth_sasl_final(out: &mut BytesMut, data: &[u8]) {
    tagged(out, b'R', |b| {
        b.put_u32(12);
        b.put_slice(data);
    });
}
pub fn parameter_status(out: &mut BytesMut, name: &str, value: &str) {
    tagged(out, b'S', |b| {
        cstr(b, name);
        cstr(b, value);
    });
}
pub fn backend_key_data(out: &mut BytesMut, pid: u32, key: u32) {
    tagged(out, b'K', |b| {
        b.put_u32(pid);
        b.put_u32(key);
    });
}
pub fn ready_for_query(out: &mut BytesMut) {
    tagged(out, b'Z', |b| b.put_u8(b'I'));
}
/// NegotiateProtocolVersion ('v'): the whole version number the server will speak and
/// the protocol options it did not recognize (see [`crate::negotiate`]).
pub fn negotiate_protocol_version(out: &mut BytesMut, n: &crate::negotiate::Negotiation) {
    tagged(out, b'v', |b| {
        b.put_u32(n.version);
        b.put_u32(n.unrecognized.len() as u32);
        for o in &n.unrecognized {
            cstr(b, o);
        }
    });
}
pub fn error_response(out: &mut BytesMut, e: &ErrorFields) {
    tagged(out, b'E', |b| {
        for (code, v) in [
            (b'S', Some(&e.severity)),
            (b'V', Some(&e.severity)),
            (b'C', Some(&e.code)),
            (b'M', Some(&e.message)),
            (b'D', e.detail.as_ref()),
            (b'H', e.hint.as_ref()),
        ] {
            if let Some(v) = v {
                b.put_u8(code);
                cstr(b, v);
            }
        }
        b.put_u8(0);
    });
}
pub fn copy_data(out: &mut BytesMut, payload: &[u8]) {
    tagged(out, b'd', |b| b.put_slice(payload));
}
pub fn copy_done(out: &mut BytesMut) {
    tagged(out, b'c', |_| {});
}
pub fn query(out: &mut BytesMut, sql: &str) {
    tagged(out, b'Q', |b| cstr(b, sql));
}
pub fn terminate(out: &mut BytesMut) {
    tagged(out, b'X', |_| {});
}
pub fn password(out: &mut BytesMut, pw: &str) {
    tagged(out, b'p', |b| cstr(b, pw));
}
pub fn sasl_initial_response(out: &mut BytesMut, mechanism: &str, data: &[u8]) {
    tagged(out, b'p', |b| {
        cstr(b, mechanism);
        b.put_i32(data.len() as i32);
        b.put_slice(data);
    });
}
pub fn sasl_response(out: &mut BytesMut, data: &[u8]) {
    tagged(out, b'p', |b| b.put_slice(data));
}
/// A protocol-3.0 startup packet.
pub fn startup(out: &mut BytesMut, params: &[(&str, &str)]) {
    let at = out.len();
    out.put_u32(0);
    out.put_u32(PROTOCOL_3_0);
    for (k, v) in params {
        cstr(out, k);
        cstr(out, v);
    }
    out.put_u8(0);
    let len = (out.len() - at) as u32;
    out[at..at + 4].copy_from_slice(&len.to_be_bytes());
}
pub fn ssl_request(out: &mut BytesMut) {
    out.put_u32(8);
    out.put_u32(SSL_REQUEST);
}
/// A CancelRequest for the backend whose BackendKeyData was (`pid`, `key`).
pub fn cancel_request(out: &mut BytesMut, pid: u32, key: u32) {
    out.put_u32(16);
    out.put_u32(CANCEL_REQUEST);
    out.put_u32(pid);
    out.put_u32(key);
}
