//! A running resource's configuration changed (`tandem adjust`, `Resource::retune`).

mod common;

use common::*;
use tandem_engine::replica::{Msg, Protocol};

/// The protocol changes online: the writes that follow take the new one, a write in
/// flight keeps the one it began under (its flags told the peers how to answer it).
#[test]
fn a_protocol_changed_online_applies_to_the_writes_that_follow() {
    let mut net = Net::new();
    // The Primary never hears that a Secondary wrote anything.
    net.pass = |_, to, m| !(to == 0 && matches!(m, Msg::WriteAck { .. }));
    net.write(1, 0, 4096);
    assert_eq!(
        net.answer(1),
        None,
        "protocol C waits for every peer's write"
    );
    let mut spec = net.spec(0);
    spec.protocol = Protocol::B;
    net.nodes[0].retune(&spec);
    net.write(2, 8192, 4096);
    assert_eq!(
        net.answer(2),
        Some(Ok(())),
        "protocol B: received by every peer is enough"
    );
    assert_eq!(net.answer(1), None, "write 1 keeps protocol C");
}
