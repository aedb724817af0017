//! The server side of SCRAM-SHA-256 (walrelay authenticating standbys) and the parser of stored
//! verifiers.
//!
//! Input layout: byte 0 holds flags, the rest is split at the first NUL into the
//! client-first-message and the client-final-message. In the client-final-message every `%N` is
//! replaced by the nonce of the server-first-message (the server's half is random, so the fuzzer
//! could never guess it).
//!
//! flags bit 0: unknown user (mock verifier)    bit 1: offer a mechanism other than SCRAM-SHA-256
//! flags bit 2: instead of fuzzing the messages, run an honest client (postgres-protocol) with
//!              the rest of the input as an ASCII password; the exchange must then succeed.
//!
//! Properties: no panic; fuzzed messages never authenticate (the proof binds the server's random
//! nonce, so no input can carry a valid one) and a mock verifier never authenticates; an honest
//! client always does; a finished exchange refuses further messages; a verifier that parses
//! renders back to a string that parses to the same verifier.
#![no_main]

use libfuzzer_sys::fuzz_target;
use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256};
use std::sync::OnceLock;
use walrelay_pgwire::scram::{ScramServer, ScramVerifier, SCRAM_SHA_256};

fn pencil() -> ScramVerifier {
    static V: OnceLock<ScramVerifier> = OnceLock::new();
    V.get_or_init(|| ScramVerifier::from_password("pencil", b"saltsaltsaltsalt", 4096))
        .clone()
}

/// The nonce `r=` of a server-first-message.
fn server_nonce(server_first: &[u8]) -> String {
    let s = std::str::from_utf8(server_first).expect("server-first-message is UTF-8");
    let r = s
        .split(',')
        .next()
        .expect("server-first-message has attributes");
    r.strip_prefix("r=")
        .expect("server-first-message starts with r=")
        .to_string()
}

fuzz_target!(|data: &[u8]| {
    verifier_text(data);

    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    if flags & 4 != 0 {
        honest_client(flags, rest);
        return;
    }
    let mock = flags & 1 != 0;
    let mechanism = if flags & 2 != 0 {
        "SCRAM-SHA-256-PLUS"
    } else {
        SCRAM_SHA_256
    };
    let (first, last) = match rest.iter().position(|&b| b == 0) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &[][..]),
    };
    let mut server = ScramServer::new(if mock { None } else { Some(pencil()) }, "u");
    let final_msg: Vec<u8> = match server.client_first(mechanism, first) {
        Ok(server_first) => {
            let nonce = server_nonce(&server_first);
            replace(last, b"%N", nonce.as_bytes())
        }
        Err(_) => last.to_vec(),
    };
    let res = server.client_final(&final_msg);
    assert!(
        res.is_err(),
        "fuzzed SCRAM exchange authenticated (mock={mock})"
    );
    // The exchange is over: anything further is refused.
    assert!(server.client_final(&final_msg).is_err());
    assert!(server.client_first(mechanism, first).is_err());
});

fn replace(hay: &[u8], pat: &[u8], with: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(hay.len());
    let mut i = 0;
    while i < hay.len() {
        if hay[i..].starts_with(pat) {
            out.extend_from_slice(with);
            i += pat.len();
        } else {
            out.push(hay[i]);
            i += 1;
        }
    }
    out
}

fn honest_client(flags: u8, rest: &[u8]) {
    // ASCII passwords are unchanged by SASLprep (or, with control characters, used raw by both
    // libpq and postgres-protocol), which ScramVerifier::from_password does not apply.
    let password: Vec<u8> = rest.iter().take(64).map(|b| b & 0x7f).collect();
    let salt: Vec<u8> = rest.iter().rev().take(16).copied().chain([0x5a]).collect();
    let iterations = 1 + u32::from(flags >> 3 & 3);
    let verifier = ScramVerifier::from_password(
        std::str::from_utf8(&password).expect("ASCII"),
        &salt,
        iterations,
    );
    let mut server = ScramServer::new(Some(verifier), "u");
    let mut client = ScramSha256::new(&password, ChannelBinding::unsupported());
    let server_first = server
        .client_first(SCRAM_SHA_256, client.message())
        .expect("client-first of an honest client");
    client
        .update(&server_first)
        .expect("client accepts server-first");
    let server_final = server
        .client_final(client.message())
        .unwrap_or_else(|e| panic!("honest client with password {password:?} refused: {e}"));
    client
        .finish(&server_final)
        .expect("client accepts server-final");
}

fn verifier_text(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if let Ok(v) = text.parse::<ScramVerifier>() {
        let s = v.to_pg_string();
        let back: ScramVerifier = s
            .parse()
            .unwrap_or_else(|e| panic!("{s:?} does not parse back: {e}"));
        assert_eq!(back, v);
    } else if let Err(e) = text.parse::<ScramVerifier>() {
        let _ = e.to_string();
    }
}
