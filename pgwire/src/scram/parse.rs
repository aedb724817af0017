//! Parsing the client's SCRAM messages (formats in the parent module's docs): each function
//! checks one message's shape and returns its parts, or a protocol error naming what is wrong.

use super::{protocol, ScramError, MAX_MESSAGE_LEN};

/// Truncates peer-supplied text quoted in an error message.
pub(super) fn clip(s: &str) -> String {
    crate::clip(s, 64)
}

pub(super) fn message_str<'a>(data: &'a [u8], what: &str) -> Result<&'a str, ScramError> {
    if data.len() > MAX_MESSAGE_LEN {
        return Err(protocol(format!(
            "{what} is {} bytes, more than the {MAX_MESSAGE_LEN} accepted",
            data.len()
        )));
    }
    std::str::from_utf8(data).map_err(|_| protocol(format!("{what} is not valid UTF-8")))
}

/// Splits `letter=value` and checks the letter; values never contain ','.
fn attr(part: &str) -> Option<(u8, &str)> {
    let (name, value) = part.split_once('=')?;
    match name.as_bytes() {
        [c] if c.is_ascii_alphabetic() => Some((*c, value)),
        _ => None,
    }
}

/// The value of the next attribute of `parts`, which must be `key`'s; else `missing` is the
/// error.
fn next_attr<'a>(
    parts: &mut impl Iterator<Item = &'a str>,
    key: u8,
    missing: &str,
) -> Result<&'a str, ScramError> {
    match parts.next().and_then(attr) {
        Some((k, v)) if k == key => Ok(v),
        _ => Err(protocol(missing)),
    }
}

/// Splits off the gs2 header (`n,,` or `y,,`), returning it and client-first-bare.
pub(super) fn split_gs2_header(msg: &str) -> Result<(&str, &str), ScramError> {
    match msg.as_bytes().first() {
        Some(b'n' | b'y') => {}
        Some(b'p') => {
            return Err(protocol(
                "the client requested channel binding, which walrelay does not support; \
                 connect with channel_binding=disable or prefer",
            ))
        }
        Some(_) => {
            return Err(protocol(
                "client-first-message must start with a gs2 header \"n,,\" or \"y,,\"",
            ))
        }
        None => return Err(protocol("client-first-message is empty")),
    }
    let rest = msg.get(1..).unwrap_or_default();
    let rest = rest.strip_prefix(',').ok_or_else(|| {
        protocol("client-first-message must start with a gs2 header \"n,,\" or \"y,,\"")
    })?;
    if rest.starts_with("a=") {
        return Err(protocol(
            "the client sent an authorization identity (a=), which is not supported; \
             the user of the startup packet is used",
        ));
    }
    let bare = rest.strip_prefix(',').ok_or_else(|| {
        protocol("client-first-message must start with a gs2 header \"n,,\" or \"y,,\"")
    })?;
    let header = msg.get(..3).unwrap_or_default();
    Ok((header, bare))
}

/// Parses client-first-bare `n=<user>,r=<nonce>[,ext...]`, returning the client nonce.
pub(super) fn parse_client_first_bare(bare: &str) -> Result<&str, ScramError> {
    if bare.starts_with("m=") {
        return Err(protocol(
            "the client requires an unsupported SCRAM extension (m=)",
        ));
    }
    let mut parts = bare.split(',');
    next_attr(
        &mut parts,
        b'n',
        "client-first-message must contain the user name attribute n= after the gs2 header",
    )?;
    let nonce = next_attr(
        &mut parts,
        b'r',
        "client-first-message must contain the nonce attribute r= after n=",
    )?;
    if nonce.is_empty()
        || !nonce
            .bytes()
            .all(|b| (0x21..=0x7e).contains(&b) && b != b',')
    {
        return Err(protocol(
            "the client nonce must be non-empty printable ASCII without ','",
        ));
    }
    for ext in parts {
        if attr(ext).is_none() {
            return Err(protocol(
                "malformed attribute in client-first-message: expected letter=value",
            ));
        }
    }
    Ok(nonce)
}

pub(super) struct ClientFinal<'a> {
    pub(super) channel_binding: &'a str,
    pub(super) nonce: &'a str,
    pub(super) proof: &'a str,
    pub(super) without_proof: &'a str,
}

/// Parses `c=..,r=..[,ext...],p=..`.
pub(super) fn parse_client_final(msg: &str) -> Result<ClientFinal<'_>, ScramError> {
    let (without_proof, last) = msg
        .rsplit_once(',')
        .ok_or_else(|| protocol("client-final-message must be c=<binding>,r=<nonce>,p=<proof>"))?;
    let proof = match attr(last) {
        Some((b'p', proof)) => proof,
        _ => {
            return Err(protocol(
                "client-final-message must end with the proof attribute p=",
            ))
        }
    };
    let mut parts = without_proof.split(',');
    let channel_binding = next_attr(
        &mut parts,
        b'c',
        "client-final-message must start with the channel-binding attribute c=",
    )?;
    let nonce = next_attr(
        &mut parts,
        b'r',
        "client-final-message must contain the nonce attribute r= after c=",
    )?;
    for ext in parts {
        match attr(ext) {
            Some((b'p', _)) => {
                return Err(protocol(
                    "the proof attribute p= must be the last of client-final-message",
                ))
            }
            Some(_) => {}
            None => {
                return Err(protocol(
                    "malformed attribute in client-final-message: expected letter=value",
                ))
            }
        }
    }
    Ok(ClientFinal {
        channel_binding,
        nonce,
        proof,
        without_proof,
    })
}
