//! Mutual authentication: each side sends a random challenge in its Hello and proves it
//! knows the shared secret by returning HMAC-SHA256(secret, context ‖ peer's challenge). The
//! context binds the proof to the resource and to the sender's node id, so a response cannot
//! be replayed to another resource or reflected back to its sender.

use hmac::{Hmac, Mac};
use sha2::Sha256;

pub const CHALLENGE_LEN: usize = 32;
pub const RESPONSE_LEN: usize = 32;

fn mac(secret: &[u8], resource: &str, sender: u8, challenge: &[u8; CHALLENGE_LEN]) -> Hmac<Sha256> {
    let mut m = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC accepts keys of any length");
    m.update(b"tandem-peer-auth-v1\0");
    m.update(resource.as_bytes());
    m.update(&[0, sender]);
    m.update(challenge);
    m
}

/// The response `sender` sends to answer `challenge` (the peer's).
pub fn respond(
    secret: &[u8],
    resource: &str,
    sender: u8,
    challenge: &[u8; CHALLENGE_LEN],
) -> [u8; RESPONSE_LEN] {
    mac(secret, resource, sender, challenge)
        .finalize()
        .into_bytes()
        .into()
}

/// Checks, in constant time, a response from node `sender` to our `challenge`.
pub fn verify(
    secret: &[u8],
    resource: &str,
    sender: u8,
    challenge: &[u8; CHALLENGE_LEN],
    response: &[u8; RESPONSE_LEN],
) -> bool {
    mac(secret, resource, sender, challenge)
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
}
