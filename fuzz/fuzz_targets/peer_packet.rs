//! Fuzzes the peer wire format's decoder (`tandem_wire::decode`) on a stream of frames.
//!
//! Invariants: no panic; a decoded frame consumes at least one byte and no more than
//! given; `NeedMore` asks for more than is there; every decoded packet encodes back to
//! bytes that decode to the same packet (nothing the decoder accepts is lost or changed).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tandem_wire::packet::{decode, encode, Decoded};

fuzz_target!(|data: &[u8]| {
    let mut at = 0;
    while at < data.len() {
        match decode(&data[at..]) {
            Ok(Decoded::Packet(p, n)) => {
                assert!(n > 0 && n <= data.len() - at);
                let mut again = Vec::new();
                encode(&p, &mut again);
                match decode(&again) {
                    Ok(Decoded::Packet(q, m)) => {
                        assert_eq!(q, p);
                        assert_eq!(m, again.len());
                    }
                    other => panic!("{p:?} re-encoded does not decode: {other:?}"),
                }
                at += n;
            }
            Ok(Decoded::NeedMore(n)) => {
                assert!(n > data.len() - at);
                break;
            }
            Err(_) => break,
        }
    }
});
