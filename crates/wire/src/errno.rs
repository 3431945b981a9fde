//! The error numbers peer packets carry (a `NegAck`, a `BarrierAck`, a read or resync
//! reply). Linux's values, so a node passes a peer's error on to its NBD client as it is.

/// Why a peer could not do what was asked; `0` on the wire means it could.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Errno {
    /// The replica failed the operation (EIO).
    Io,
    /// Not an error: the peer lacks the data for now; ask elsewhere or later (EAGAIN).
    Again,
    /// Any other number a peer sent.
    Other(u32),
}

impl Errno {
    pub const fn code(self) -> u32 {
        match self {
            Errno::Io => 5,
            Errno::Again => 11,
            Errno::Other(n) => n,
        }
    }

    /// The error a wire number names, or `None` for 0 (success).
    pub const fn from_code(n: u32) -> Option<Errno> {
        match n {
            0 => None,
            5 => Some(Errno::Io),
            11 => Some(Errno::Again),
            n => Some(Errno::Other(n)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Errno;

    #[test]
    fn codes_round_trip() {
        for e in [Errno::Io, Errno::Again, Errno::Other(28)] {
            assert_eq!(Errno::from_code(e.code()), Some(e));
        }
        assert_eq!(Errno::from_code(0), None);
    }
}
