//! Auto-promote and auto-demote, as DRBD's `auto-promote`: the first application client
//! of a resource makes its node Primary when no other node is, and when the last one
//! leaves, a node promoted that way becomes Secondary again once every request it took
//! is answered. A node the administrator promoted stays Primary.

#[derive(Debug, Default)]
pub(super) struct AutoRole {
    clients: usize,
    /// Primary because a client attached (not by the administrator's word).
    promoted: bool,
    /// A client's promotion was refused only because a peer that just connected had not
    /// yet said which Primary it follows: tried again once it has.
    retry: bool,
}

impl AutoRole {
    /// A client attached: whether it is the one that should promote.
    pub(super) fn attach(&mut self) {
        self.clients += 1;
    }

    pub(super) fn detach(&mut self) {
        self.clients = self.clients.saturating_sub(1);
    }

    pub(super) fn clients(&self) -> usize {
        self.clients
    }

    pub(super) fn promoted(&mut self) {
        self.promoted = true;
    }

    /// The role was set by other means (the administrator, a forced demotion).
    pub(super) fn clear(&mut self) {
        self.promoted = false;
        self.retry = false;
    }

    pub(super) fn retry_later(&mut self) {
        self.retry = true;
    }

    /// A promotion refused for a moment waits to be tried again.
    pub(super) fn retry_pending(&self) -> bool {
        self.retry
    }

    /// Whether that promotion is to be tried now (once).
    pub(super) fn take_retry(&mut self) -> bool {
        std::mem::take(&mut self.retry) && self.clients > 0
    }

    /// No client is left on a node promoted for its clients.
    pub(super) fn should_demote(&self) -> bool {
        self.clients == 0 && self.promoted
    }
}
