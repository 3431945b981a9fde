//! Coalescing of durability barriers.
//!
//! NBD's contract: a FLUSH covers every write *completed* before the FLUSH arrived. An
//! fdatasync already running may have started before some of those completions, so a flush
//! request that arrives while one runs waits for the next one. All requests waiting at that
//! point share it: one fdatasync, however many flushes (and FUA writes) are queued.

use crate::io::ReqId;

#[derive(Debug, Default)]
pub struct FlushBatcher {
    /// Requests covered by the barrier in flight.
    running: Option<(u64, Vec<ReqId>)>,
    /// Requests that need a barrier issued after the running one.
    waiting: Vec<ReqId>,
    next_seq: u64,
    /// Spare vectors, so steady state does not allocate.
    spare: Vec<Vec<ReqId>>,
}

impl FlushBatcher {
    /// Queues `req` for the next barrier. Returns the sequence number of a barrier to issue
    /// now, if none is running.
    pub fn request(&mut self, req: ReqId) -> Option<u64> {
        self.waiting.push(req);
        self.start_if_idle()
    }

    /// The barrier `seq` finished: returns the requests it covered (to complete) and
    /// possibly the next barrier to issue for requests that queued meanwhile.
    pub fn finished(&mut self, seq: u64) -> (Vec<ReqId>, Option<u64>) {
        let (running_seq, covered) = self
            .running
            .take()
            .expect("a flush finished while none was running");
        assert_eq!(
            running_seq, seq,
            "flush completions must match the running flush"
        );
        let next = self.start_if_idle();
        (covered, next)
    }

    /// Returns a vector from [`finished`](Self::finished) for reuse.
    pub fn recycle(&mut self, mut v: Vec<ReqId>) {
        v.clear();
        self.spare.push(v);
    }

    pub fn is_idle(&self) -> bool {
        self.running.is_none() && self.waiting.is_empty()
    }

    fn start_if_idle(&mut self) -> Option<u64> {
        if self.running.is_some() || self.waiting.is_empty() {
            return None;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let fresh = self.spare.pop().unwrap_or_default();
        let batch = std::mem::replace(&mut self.waiting, fresh);
        self.running = Some((seq, batch));
        Some(seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_during_a_flush_wait_for_the_next_one() {
        let mut f = FlushBatcher::default();
        let s0 = f.request(ReqId(1)).unwrap();
        assert_eq!(f.request(ReqId(2)), None);
        assert_eq!(f.request(ReqId(3)), None);
        let (done, next) = f.finished(s0);
        assert_eq!(done, vec![ReqId(1)]);
        let s1 = next.unwrap();
        let (done, next) = f.finished(s1);
        assert_eq!(
            done,
            vec![ReqId(2), ReqId(3)],
            "one barrier serves every queued flush"
        );
        assert!(next.is_none());
        assert!(f.is_idle());
    }
}
