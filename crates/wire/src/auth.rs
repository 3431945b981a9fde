//! Mutual authentication: each side sends a random challenge in its Hello and proves it
//! knows the shared secret by returning HMAC-SHA256(secret, context ‖ peer's challenge). The
//! context binds the proof to the resource and to the sender's node id, so a response cannot
//! be replayed to another resource or reflected back to its sender.
//!
//! Under TLS the proof can also be bound to the TLS channel it travels in
//! ([`respond_bound`], [`verify_bound`]): the channel's RFC 9266 `tls-exporter` value
//! ([`EXPORTER_LABEL`], [`EXPORTER_LEN`] bytes, no context) is mixed into the HMAC. Both ends
//! of one TLS connection compute the same value; a man in the middle who terminates TLS
//! towards each side has two connections with two different values, so a response relayed
//! from one to the other does not verify. This is what lets peers that trust no
//! certificate (each shows an ephemeral self-signed one) still authenticate each other by
//! the shared secret: in effect a key derived from it, without TLS-PSK (which rustls lacks).
//! TLS 1.3 only: TLS 1.2's exporter is channel-unique only with the extended master secret.

use hmac::{Hmac, Mac};
use sha2::Sha256;

pub const CHALLENGE_LEN: usize = 32;
pub const RESPONSE_LEN: usize = 32;

/// RFC 9266's exporter label for `tls-exporter` channel bindings.
pub const EXPORTER_LABEL: &[u8] = b"EXPORTER-Channel-Binding";
/// Bytes taken from the exporter.
pub const EXPORTER_LEN: usize = 32;

fn mac(
    secret: &[u8],
    resource: &str,
    sender: u8,
    challenge: &[u8; CHALLENGE_LEN],
    binding: Option<&[u8; EXPORTER_LEN]>,
) -> Hmac<Sha256> {
    let mut m = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC accepts keys of any length");
    m.update(b"tandem-peer-auth-v1\0");
    m.update(resource.as_bytes());
    m.update(&[0, sender]);
    m.update(challenge);
    // Without a binding the MAC is what it always was (nodes of older versions agree).
    if let Some(b) = binding {
        m.update(b"\0tls-exporter\0");
        m.update(b);
    }
    m
}

/// The response `sender` sends to answer `challenge` (the peer's).
pub fn respond(
    secret: &[u8],
    resource: &str,
    sender: u8,
    challenge: &[u8; CHALLENGE_LEN],
) -> [u8; RESPONSE_LEN] {
    mac(secret, resource, sender, challenge, None)
        .finalize()
        .into_bytes()
        .into()
}

/// [`respond`] bound to a TLS channel by its `tls-exporter` value.
pub fn respond_bound(
    secret: &[u8],
    resource: &str,
    sender: u8,
    challenge: &[u8; CHALLENGE_LEN],
    binding: &[u8; EXPORTER_LEN],
) -> [u8; RESPONSE_LEN] {
    mac(secret, resource, sender, challenge, Some(binding))
        .finalize()
        .into_bytes()
        .into()
}

/// [`verify`] of a response bound to the TLS channel whose `tls-exporter` value we see.
pub fn verify_bound(
    secret: &[u8],
    resource: &str,
    sender: u8,
    challenge: &[u8; CHALLENGE_LEN],
    binding: &[u8; EXPORTER_LEN],
    response: &[u8; RESPONSE_LEN],
) -> bool {
    mac(secret, resource, sender, challenge, Some(binding))
        .verify_slice(response)
        .is_ok()
}

/// Checks, in constant time, a response from node `sender` to our `challenge`.
pub fn verify(
    secret: &[u8],
    resource: &str,
    sender: u8,
    challenge: &[u8; CHALLENGE_LEN],
    response: &[u8; RESPONSE_LEN],
) -> bool {
    mac(secret, resource, sender, challenge, None)
        .verify_slice(response)
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn right_secret_verifies_wrong_one_does_not() {
        let ch = [7u8; CHALLENGE_LEN];
        let r = respond(b"s3cret", "r0", 1, &ch);
        assert!(verify(b"s3cret", "r0", 1, &ch, &r));
        assert!(!verify(b"other", "r0", 1, &ch, &r));
        assert!(
            !verify(b"s3cret", "r1", 1, &ch, &r),
            "bound to the resource"
        );
        assert!(!verify(b"s3cret", "r0", 2, &ch, &r), "bound to the sender");
        assert!(
            !verify(b"s3cret", "r0", 1, &[8u8; CHALLENGE_LEN], &r),
            "bound to the challenge"
        );
    }

    #[test]
    fn a_bound_response_verifies_only_on_its_own_channel() {
        let ch = [7u8; CHALLENGE_LEN];
        let (here, there) = ([1u8; EXPORTER_LEN], [2u8; EXPORTER_LEN]);
        let r = respond_bound(b"s3cret", "r0", 1, &ch, &here);
        assert!(verify_bound(b"s3cret", "r0", 1, &ch, &here, &r));
        assert!(
            !verify_bound(b"s3cret", "r0", 1, &ch, &there, &r),
            "relayed into another TLS connection"
        );
        assert!(!verify(b"s3cret", "r0", 1, &ch, &r), "not an unbound one");
        assert!(!verify_bound(b"other", "r0", 1, &ch, &here, &r));
        let unbound = respond(b"s3cret", "r0", 1, &ch);
        assert!(!verify_bound(b"s3cret", "r0", 1, &ch, &here, &unbound));
    }
}
