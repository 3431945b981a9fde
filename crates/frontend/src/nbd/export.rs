//! What the server offers a client: one entry per named export.

use super::wire::*;

/// Block size constraints advertised with `NBD_INFO_BLOCK_SIZE` and enforced on requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockSizes {
    /// Every offset and length must be a multiple of this (a power of two, 1..=64 KiB).
    pub minimum: u32,
    pub preferred: u32,
    /// Largest READ or WRITE payload accepted.
    pub maximum: u32,
}

impl BlockSizes {
    pub const fn new(minimum: u32) -> BlockSizes {
        let preferred = if minimum > 4096 { minimum } else { 4096 };
        BlockSizes {
            minimum,
            preferred,
            maximum: MAX_PAYLOAD,
        }
    }

    /// Checks the constraints the protocol puts on advertised sizes.
    pub fn validate(&self) -> Result<(), String> {
        let BlockSizes {
            minimum,
            preferred,
            maximum,
        } = *self;
        if !minimum.is_power_of_two() || minimum > 65536 {
            return Err(format!(
                "minimum block size {minimum} must be a power of two up to 65536"
            ));
        }
        if !preferred.is_power_of_two() || preferred < minimum.max(512) {
            return Err(format!(
                "preferred block size {preferred} must be a power of two >= {}",
                minimum.max(512)
            ));
        }
        if maximum < preferred || maximum % minimum != 0 || maximum > MAX_PAYLOAD {
            return Err(format!("maximum block size {maximum} must be a multiple of {minimum} in {preferred}..={MAX_PAYLOAD}"));
        }
        Ok(())
    }
}

/// One export as the NBD frontend sees it. The daemon fills this from the volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportInfo {
    pub name: String,
    pub description: String,
    pub size: u64,
    pub read_only: bool,
    pub block: BlockSizes,
}

impl ExportInfo {
    /// Transmission flags for this export, given whether structured replies were negotiated.
    pub fn transmission_flags(&self, structured: bool) -> u16 {
        let mut f = FLAG_HAS_FLAGS
            | FLAG_SEND_FLUSH
            | FLAG_SEND_FUA
            | FLAG_SEND_CACHE
            | FLAG_CAN_MULTI_CONN;
        if self.read_only {
            f |= FLAG_READ_ONLY;
        } else {
            // TRIM is advisory and WRITE_ZEROES can always fall back to writing; whether a
            // zero is *fast* is answered per request (ENOTSUP when it would not be).
            f |= FLAG_SEND_TRIM | FLAG_SEND_WRITE_ZEROES | FLAG_SEND_FAST_ZERO;
        }
        if structured {
            // We always answer a read with a single data chunk, so DF costs nothing.
            f |= FLAG_SEND_DF;
        }
        f
    }
}
