//! Server side of SCRAM-SHA-256 authentication (RFC 5802 / RFC 7677), as PostgreSQL does it.
//!
//! Sans-IO: the caller carries the bytes of the SASL messages of the PostgreSQL protocol.
//!
//! # Exchange
//!
//! 1. Server → `AuthenticationSASL` listing [`ScramServer::MECHANISMS`].
//! 2. Client → `SASLInitialResponse` (mechanism name + client-first-message), fed to
//!    [`ScramServer::client_first`], which returns the server-first-message to send in
//!    `AuthenticationSASLContinue`.
//! 3. Client → `SASLResponse` (client-final-message), fed to [`ScramServer::client_final`], which
//!    returns the server-final-message to send in `AuthenticationSASLFinal` (followed by
//!    `AuthenticationOk`), or [`ScramError::AuthenticationFailed`], on which the caller sends an
//!    `ErrorResponse` (SQLSTATE 28P01) like PostgreSQL does.
//!
//! # Message formats (comma-separated `letter=value` attributes, UTF-8)
//!
//! - client-first-message = gs2-header client-first-bare
//!   - gs2-header = `n,,` (client does not support channel binding) or `y,,` (client supports it
//!     but thinks the server does not). `p=<type>,,` (channel binding) and an authzid (`n,a=x,`)
//!     are rejected.
//!   - client-first-bare = `n=<user>,r=<client nonce>[,<extensions>]`. PostgreSQL clients send an
//!     empty user (`n=,`); the user of the startup packet counts, so any value is accepted. A
//!     leading `m=` (mandatory extension) is rejected.
//! - server-first-message = `r=<client nonce><server nonce>,s=<salt base64>,i=<iterations>`; the
//!   server nonce is 18 random bytes in base64.
//! - client-final-message = `c=<base64 of gs2-header>,r=<full nonce>[,<extensions>],p=<proof base64>`;
//!   `n,,` is `biws` and `y,,` is `eSws` in base64. `p` must be the last attribute.
//! - server-final-message = `v=<base64 of ServerSignature>`.
//!
//! # Keys
//!
//! ```text
//! SaltedPassword  = Hi(password, salt, iterations)        (PBKDF2-HMAC-SHA-256, one block)
//! ClientKey       = HMAC(SaltedPassword, "Client Key")
//! StoredKey       = SHA-256(ClientKey)
//! ServerKey       = HMAC(SaltedPassword, "Server Key")
//! AuthMessage     = client-first-bare "," server-first-message "," client-final-without-proof
//! ClientSignature = HMAC(StoredKey, AuthMessage)
//! ClientProof     = ClientKey XOR ClientSignature          (sent by the client)
//! ServerSignature = HMAC(ServerKey, AuthMessage)           (sent by the server)
//! ```
//!
//! The server recovers ClientKey = ClientProof XOR ClientSignature and accepts iff
//! SHA-256(ClientKey) equals StoredKey.

use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

type HmacSha256 = Hmac<Sha256>;

/// The only SASL mechanism offered.
pub const SCRAM_SHA_256: &str = "SCRAM-SHA-256";
/// Iteration count PostgreSQL uses by default (`scram_iterations`), also used for mock verifiers.
pub const DEFAULT_ITERATIONS: u32 = 4096;
/// Salt length PostgreSQL uses (`SCRAM_DEFAULT_SALT_LEN`).
pub const DEFAULT_SALT_LEN: usize = 16;
/// Raw bytes of the server's nonce part (`SCRAM_RAW_NONCE_LEN`).
const SERVER_NONCE_RAW_LEN: usize = 18;
/// Largest client message accepted; real ones are about 30 and 110 bytes.
pub const MAX_MESSAGE_LEN: usize = 1024;
/// Prefix of a verifier in pg_authid.rolpassword.
const VERIFIER_PREFIX: &str = "SCRAM-SHA-256$";

/// Errors of SCRAM verifier parsing and of the server side of the exchange.
#[derive(Debug, thiserror::Error)]
pub enum ScramError {
    /// A stored verifier string is not in PostgreSQL's format.
    #[error(
        "invalid SCRAM-SHA-256 verifier: {0}; expected PostgreSQL's pg_authid format \
         SCRAM-SHA-256$<iterations>:<salt base64>$<StoredKey base64>:<ServerKey base64> \
         (copy it from pg_authid.rolpassword or generate a new one)"
    )]
    BadVerifier(String),
    /// The client sent a malformed message, or sent it out of order.
    #[error("SCRAM-SHA-256 protocol error: {0}")]
    Protocol(String),
    /// The client chose a mechanism other than SCRAM-SHA-256.
    #[error(
        "unsupported SASL mechanism {0:?}: walrelay offers only SCRAM-SHA-256 without channel \
         binding; connect with channel_binding=disable or prefer"
    )]
    UnsupportedMechanism(String),
    /// Wrong password, or unknown user (indistinguishable on purpose).
    #[error("password authentication failed: check the user name and password")]
    AuthenticationFailed,
}

fn protocol(msg: impl Into<String>) -> ScramError {
    ScramError::Protocol(msg.into())
}

fn bad_verifier(msg: impl Into<String>) -> ScramError {
    ScramError::BadVerifier(msg.into())
}

/// A SCRAM-SHA-256 secret as PostgreSQL stores it in `pg_authid.rolpassword`:
/// `SCRAM-SHA-256$<iterations>:<salt base64>$<StoredKey base64>:<ServerKey base64>`.
///
/// `Debug` does not print the keys.
#[derive(Clone, PartialEq, Eq)]
pub struct ScramVerifier {
    pub iterations: u32,
    pub salt: Vec<u8>,
    pub stored_key: [u8; 32],
    pub server_key: [u8; 32],
}

impl fmt::Debug for ScramVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScramVerifier")
            .field("iterations", &self.iterations)
            .field("salt", &B64.encode(&self.salt))
            .finish_non_exhaustive()
    }
}

impl ScramVerifier {
    /// Derives the verifier of `password` for `salt` and `iterations` (an iteration count of 0 is
    /// taken as 1).
    ///
    /// The password is used as its raw UTF-8 bytes. PostgreSQL and its clients first apply
    /// SASLprep (RFC 4013), which leaves every ASCII password unchanged but may rewrite
    /// non-ASCII ones (NFKC normalisation, non-ASCII spaces); for such passwords use
    /// [`new_verifier`], which does apply SASLprep.
    pub fn from_password(password: &str, salt: &[u8], iterations: u32) -> Self {
        let iterations = iterations.max(1);
        let salted = hi(password.as_bytes(), salt, iterations);
        let client_key = hmac(&salted, &[b"Client Key"]);
        ScramVerifier {
            iterations,
            salt: salt.to_vec(),
            stored_key: Sha256::digest(client_key).into(),
            server_key: hmac(&salted, &[b"Server Key"]),
        }
    }

    /// Renders the verifier in PostgreSQL's pg_authid format.
    pub fn to_pg_string(&self) -> String {
        format!(
            "{VERIFIER_PREFIX}{}:{}${}:{}",
            self.iterations,
            B64.encode(&self.salt),
            B64.encode(self.stored_key),
            B64.encode(self.server_key)
        )
    }
}

impl FromStr for ScramVerifier {
    type Err = ScramError;

    /// Parses PostgreSQL's pg_authid format (surrounding whitespace is ignored). Error messages
    /// never echo the secret.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let rest = s
            .trim()
            .strip_prefix(VERIFIER_PREFIX)
            .ok_or_else(|| bad_verifier("it does not start with \"SCRAM-SHA-256$\""))?;
        let (iter_salt, keys) = rest
            .split_once('$')
            .ok_or_else(|| bad_verifier("missing '$' between <iterations>:<salt> and the keys"))?;
        let (iterations, salt) = iter_salt
            .split_once(':')
            .ok_or_else(|| bad_verifier("missing ':' between iterations and salt"))?;
        let (stored, server) = keys
            .split_once(':')
            .ok_or_else(|| bad_verifier("missing ':' between StoredKey and ServerKey"))?;
        if iterations.is_empty() || !iterations.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad_verifier("the iteration count is not a decimal number"));
        }
        let iterations: u32 = iterations
            .parse()
            .map_err(|_| bad_verifier("the iteration count is out of range"))?;
        if iterations == 0 {
            return Err(bad_verifier("the iteration count is 0"));
        }
        let salt = B64
            .decode(salt)
            .map_err(|_| bad_verifier("the salt is not valid base64"))?;
        if salt.is_empty() {
            return Err(bad_verifier("the salt is empty"));
        }
        Ok(ScramVerifier {
            iterations,
            salt,
            stored_key: decode_key(stored, "StoredKey")?,
            server_key: decode_key(server, "ServerKey")?,
        })
    }
}

fn decode_key(b64: &str, what: &str) -> Result<[u8; 32], ScramError> {
    let bytes = B64
        .decode(b64)
        .map_err(|_| bad_verifier(format!("{what} is not valid base64")))?;
    <[u8; 32]>::try_from(bytes.as_slice())
        .map_err(|_| bad_verifier(format!("{what} is {} bytes, not 32", bytes.len())))
}

/// A new verifier for `password` in PostgreSQL's pg_authid format: random 16-byte salt, 4096
/// iterations, SASLprep applied to the password exactly as PostgreSQL and libpq do.
pub fn new_verifier(password: &str) -> String {
    // postgres-protocol is what clients use to compute proofs, and it writes exactly the format
    // of `ScramVerifier::to_pg_string`, including SASLprep, which we cannot do ourselves.
    postgres_protocol::password::scram_sha_256(password.as_bytes())
}

/// Hi() of RFC 5802: PBKDF2-HMAC-SHA-256 producing one 32-byte block.
fn hi(password: &[u8], salt: &[u8], iterations: u32) -> [u8; 32] {
    let keyed = hmac_key(password);
    let mut mac = keyed.clone();
    mac.update(salt);
    mac.update(&1u32.to_be_bytes());
    let mut u: [u8; 32] = mac.finalize().into_bytes().into();
    let mut out = u;
    for _ in 1..iterations {
        let mut mac = keyed.clone();
        mac.update(&u);
        u = mac.finalize().into_bytes().into();
        for (o, x) in out.iter_mut().zip(u) {
            *o ^= x;
        }
    }
    out
}

fn hmac_key(key: &[u8]) -> HmacSha256 {
    // HMAC takes keys of any length (long ones are hashed), so this cannot fail.
    <HmacSha256 as Mac>::new_from_slice(key).expect("HMAC accepts keys of any length")
}

fn hmac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut mac = hmac_key(key);
    for p in parts {
        mac.update(p);
    }
    mac.finalize().into_bytes().into()
}

/// Compares without an early exit, so timing does not reveal where the keys differ.
fn ct_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// Process-wide secret for mock salts (PostgreSQL keeps its `mock_auth_nonce` in pg_control).
/// What unknown users' mock verifiers look like: the secret their salts derive from, and
/// their iteration count.
#[derive(Clone)]
pub struct MockParams {
    secret: [u8; 32],
    iterations: u32,
}

impl MockParams {
    /// Derived from the configured verifiers (in a stable order): the same across restarts,
    /// as PostgreSQL's mock salts are (from pg_control's nonce), so an unknown user's salt does
    /// not change where a known user's stays; and with the iteration count most of them have,
    /// so the exchange looks like a known user's. The secret hashes their server keys, which
    /// never leave the server.
    pub fn from_verifiers<'a>(verifiers: impl IntoIterator<Item = &'a ScramVerifier>) -> Self {
        let mut h = Sha256::new().chain_update(b"walrelay scram mock salt");
        let mut counts: Vec<(u32, usize)> = Vec::new();
        for v in verifiers {
            h.update(v.server_key);
            match counts.iter_mut().find(|(i, _)| *i == v.iterations) {
                Some((_, n)) => *n += 1,
                None => counts.push((v.iterations, 1)),
            }
        }
        let iterations = counts
            .iter()
            .max_by_key(|(i, n)| (*n, std::cmp::Reverse(*i)))
            .map_or(DEFAULT_ITERATIONS, |(i, _)| *i);
        MockParams {
            secret: h.finalize().into(),
            iterations,
        }
    }

    /// A random secret for this process, and PostgreSQL's default iteration count.
    fn per_process() -> &'static MockParams {
        static PARAMS: OnceLock<MockParams> = OnceLock::new();
        PARAMS.get_or_init(|| MockParams {
            secret: rand::random(),
            iterations: DEFAULT_ITERATIONS,
        })
    }
}

/// Verifier used for unknown users: a salt derived from the user name and the secret (stable
/// for a given secret, like PostgreSQL's `scram_mock_salt`) and keys no proof can match.
fn mock_verifier(username: &str, mock: &MockParams) -> ScramVerifier {
    let digest = Sha256::new()
        .chain_update(username.as_bytes())
        .chain_update(mock.secret)
        .finalize();
    ScramVerifier {
        iterations: mock.iterations,
        salt: digest.iter().copied().take(DEFAULT_SALT_LEN).collect(),
        stored_key: [0; 32],
        server_key: [0; 32],
    }
}

enum State {
    /// Waiting for the SASLInitialResponse.
    Initial,
    /// Server-first sent; waiting for the client-final-message.
    ServerFirstSent {
        gs2_header: String,
        client_first_bare: String,
        server_first: String,
        nonce: String,
    },
    /// Finished (successfully or not); any further message is an error.
    Done,
}

/// Server side of one SCRAM-SHA-256 exchange. See the module docs for the message flow.
pub struct ScramServer {
    verifier: ScramVerifier,
    /// True when running against a mock verifier: the exchange always fails at the end.
    doomed: bool,
    state: State,
}

impl fmt::Debug for ScramServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            State::Initial => "Initial",
            State::ServerFirstSent { .. } => "ServerFirstSent",
            State::Done => "Done",
        };
        f.debug_struct("ScramServer")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}

impl ScramServer {
    /// The mechanism names to offer in AuthenticationSASL: only "SCRAM-SHA-256" (no -PLUS; we do
    /// not do channel binding).
    pub const MECHANISMS: &'static [&'static str] = &[SCRAM_SHA_256];

    /// `verifier` None means the user is unknown: run the exchange with a mock verifier
    /// (deterministic per username within this process, like PostgreSQL's scram_mock_salt) and
    /// fail at the end, so an unknown user is indistinguishable from a wrong password.
    pub fn new(verifier: Option<ScramVerifier>, username_for_mock: &str) -> Self {
        Self::with_mock(verifier, username_for_mock, MockParams::per_process())
    }

    /// Like [`ScramServer::new`], with mock verifiers as `mock` says (see
    /// [`MockParams::from_verifiers`]: the same across restarts).
    pub fn with_mock(
        verifier: Option<ScramVerifier>,
        username_for_mock: &str,
        mock: &MockParams,
    ) -> Self {
        let (verifier, doomed) = match verifier {
            Some(v) => (v, false),
            None => (mock_verifier(username_for_mock, mock), true),
        };
        ScramServer {
            verifier,
            doomed,
            state: State::Initial,
        }
    }

    /// Takes the SASLInitialResponse: chosen mechanism and client-first-message bytes; returns
    /// server-first-message bytes.
    pub fn client_first(&mut self, mechanism: &str, data: &[u8]) -> Result<Vec<u8>, ScramError> {
        if !matches!(self.state, State::Initial) {
            self.state = State::Done;
            return Err(protocol(
                "unexpected SASLInitialResponse: the SCRAM exchange has already started",
            ));
        }
        self.state = State::Done;
        if mechanism != SCRAM_SHA_256 {
            return Err(ScramError::UnsupportedMechanism(clip(mechanism)));
        }
        let msg = message_str(data, "client-first-message")?;
        let (gs2_header, bare) = split_gs2_header(msg)?;
        let client_nonce = parse_client_first_bare(bare)?;

        let server_nonce = B64.encode(rand::random::<[u8; SERVER_NONCE_RAW_LEN]>());
        let nonce = format!("{client_nonce}{server_nonce}");
        let server_first = format!(
            "r={nonce},s={},i={}",
            B64.encode(&self.verifier.salt),
            self.verifier.iterations
        );
        let out = server_first.clone().into_bytes();
        self.state = State::ServerFirstSent {
            gs2_header: gs2_header.to_string(),
            client_first_bare: bare.to_string(),
            server_first,
            nonce,
        };
        Ok(out)
    }

    /// Takes the client-final-message; returns server-final-message bytes ("v=...") on success,
    /// ScramError::AuthenticationFailed on a wrong password/unknown user.
    pub fn client_final(&mut self, data: &[u8]) -> Result<Vec<u8>, ScramError> {
        let (gs2_header, client_first_bare, server_first, nonce) =
            match std::mem::replace(&mut self.state, State::Done) {
                State::ServerFirstSent {
                    gs2_header,
                    client_first_bare,
                    server_first,
                    nonce,
                } => (gs2_header, client_first_bare, server_first, nonce),
                State::Initial => {
                    return Err(protocol(
                        "unexpected SASLResponse: no SASLInitialResponse was received first",
                    ))
                }
                State::Done => {
                    return Err(protocol(
                        "unexpected SASLResponse: the SCRAM exchange is already finished",
                    ))
                }
            };
        let msg = message_str(data, "client-final-message")?;
        let final_msg = parse_client_final(msg)?;

        let cbind = B64.decode(final_msg.channel_binding).map_err(|_| {
            protocol("the channel-binding attribute c= of client-final-message is not base64")
        })?;
        if cbind != gs2_header.as_bytes() {
            return Err(protocol(
                "the channel-binding attribute c= of client-final-message does not match the \
                 gs2 header of client-first-message",
            ));
        }
        if final_msg.nonce != nonce {
            return Err(protocol(
                "the nonce of client-final-message does not match the server's",
            ));
        }
        let proof = B64
            .decode(final_msg.proof)
            .map_err(|_| protocol("the proof p= of client-final-message is not base64"))?;
        let proof = <[u8; 32]>::try_from(proof.as_slice()).map_err(|_| {
            protocol(format!(
                "the proof p= of client-final-message is {} bytes, not 32",
                proof.len()
            ))
        })?;

        let parts: [&[u8]; 5] = [
            client_first_bare.as_bytes(),
            b",",
            server_first.as_bytes(),
            b",",
            final_msg.without_proof.as_bytes(),
        ];
        let client_signature = hmac(&self.verifier.stored_key, &parts);
        let mut client_key = proof;
        for (k, s) in client_key.iter_mut().zip(client_signature) {
            *k ^= s;
        }
        let computed: [u8; 32] = Sha256::digest(client_key).into();
        if !ct_eq(&computed, &self.verifier.stored_key) || self.doomed {
            return Err(ScramError::AuthenticationFailed);
        }
        let server_signature = hmac(&self.verifier.server_key, &parts);
        Ok(format!("v={}", B64.encode(server_signature)).into_bytes())
    }
}

mod parse;
use parse::{clip, message_str, parse_client_final, parse_client_first_bare, split_gs2_header};

#[cfg(test)]
mod tests;
