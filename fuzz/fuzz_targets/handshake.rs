//! Fuzzes the server handshake.
//!
//! Input layout: byte 0 picks the export table and whether the server is shutting down,
//! bytes 1..5 the chunk sizes; the rest is what the client sends. Invariants: no panic, never
//! more consumed than given, nothing consumed or sent after `Done`/`Close`, a `Done` export
//! index inside the table, and the same result whether the bytes arrive in chunks or whole.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tandem_frontend::nbd::{BlockSizes, ExportInfo, Handshake, HandshakeStep};

fn export(name: &str, description: &str, size: u64, read_only: bool, minimum: u32) -> ExportInfo {
    ExportInfo {
        name: name.to_string(),
        description: description.to_string(),
        size,
        read_only,
        block: BlockSizes::new(minimum),
    }
}

fn table(choice: u8) -> Vec<ExportInfo> {
    match choice % 3 {
        0 => vec![],
        1 => vec![export("", "", 1 << 30, false, 512)],
        _ => vec![
            export("a", "first", 1 << 30, false, 512),
            export("b", "", 1 << 40, true, 4096),
            export("disk0", "third", u64::MAX, false, 1),
        ],
    }
}

/// Feeds `input` in chunks cycling through `sizes` the way a driver does; returns the bytes
/// consumed, the final step and everything the server sent.
fn drive(
    input: &[u8],
    sizes: &[usize],
    exports: &[ExportInfo],
    shutting_down: bool,
) -> (usize, HandshakeStep, Vec<u8>) {
    let mut hs = Handshake::new();
    let mut out = Vec::new();
    let (mut start, mut end, mut i) = (0usize, 0usize, 0usize);
    loop {
        let (n, step) = hs.feed(&input[start..end], exports, shutting_down, &mut out);
        assert!(n <= end - start);
        start += n;
        match &step {
            HandshakeStep::NeedMore => {}
            terminal => {
                if let HandshakeStep::Done(neg) = terminal {
                    assert!(neg.export < exports.len());
                    assert_eq!(
                        neg.transmission_flags,
                        exports[neg.export].transmission_flags(neg.structured_replies)
                    );
                }
                // Finished: no more bytes taken, nothing more said.
                let sent = out.len();
                let (n, again) = hs.feed(&input[start..], exports, shutting_down, &mut out);
                assert_eq!((n, again), (0, HandshakeStep::NeedMore));
                let (n, again) = hs.feed(&[0, 0, 0, 3], exports, shutting_down, &mut out);
                assert_eq!((n, again), (0, HandshakeStep::NeedMore));
                assert_eq!(out.len(), sent);
                return (start, step, out);
            }
        }
        if end == input.len() {
            return (start, HandshakeStep::NeedMore, out);
        }
        end = (end + sizes[i % sizes.len()]).min(input.len());
        i += 1;
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 5 {
        return;
    }
    let exports = table(data[0]);
    let shutting_down = data[0] & 0x80 != 0;
    let sizes: Vec<usize> = data[1..5].iter().map(|&b| usize::from(b).max(1)).collect();
    let input = &data[5..];
    let chunked = drive(input, &sizes, &exports, shutting_down);
    let whole = drive(input, &[usize::MAX / 2], &exports, shutting_down);
    assert_eq!(chunked, whole);
});
