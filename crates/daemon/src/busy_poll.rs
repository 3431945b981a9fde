//! Waiting for events with busy polling.
//!
//! A request that crosses processes (client → server, Primary → peers and back) pays a wakeup
//! for every hop into a sleeping process, and on virtual machines a wakeup costs more than the
//! work. After a burst of events the loop therefore polls without sleeping for a short
//! window, yielding the CPU between polls (spinning without yielding starves the very
//! processes it waits for when there are fewer cores than busy processes). An idle loop
//! blocks as usual, and so does a loop whose last round handled a burst of work: requests
//! then arrive faster than they are served (a deep queue), the next burst comes while the
//! other processes of the chain use the CPUs, and polling would only take CPU from them.

use mio::{Events, Poll};
use std::io;
use std::time::{Duration, Instant};

pub struct Waiter {
    window: Option<Duration>,
    /// The last wait returned events: more are likely soon.
    busy: bool,
}

/// Requests and packets handled in one round from which the loop blocks instead of polling.
/// fio 4k randwrite iodepth 16×2 through a diskless Primary on this 2-core VM, six runs
/// each: polling after every round 103k IOPS (the Secondaries spent a third of their CPU
/// in `sched_yield` and `epoll_wait`), blocking after rounds of ≥ 4 items 110k; iodepth 1
/// (one item per round) unchanged.
pub const BURST: usize = 4;

impl Waiter {
    /// `window` zero: never spin.
    pub fn new(window: Duration) -> Waiter {
        Waiter {
            window: Some(window).filter(|w| !w.is_zero()),
            busy: false,
        }
    }

    /// Fills `events`, waiting at most `timeout` (`None`: indefinitely) once the busy
    /// window, if any, has passed without events. `handled`: the requests and packets the
    /// caller handled since its last wait.
    pub fn wait(
        &mut self,
        poll: &mut Poll,
        events: &mut Events,
        timeout: Option<Duration>,
        handled: usize,
    ) -> io::Result<()> {
        self.wait_stretched(poll, events, timeout, handled, 1)
    }

    /// [`wait`](Self::wait) with the busy window `stretch` times as long: for when the
    /// caller knows the next event is due after a longer chain of hops than usual.
    pub fn wait_stretched(
        &mut self,
        poll: &mut Poll,
        events: &mut Events,
        timeout: Option<Duration>,
        handled: usize,
        stretch: u32,
    ) -> io::Result<()> {
        if let (Some(window), true, true) = (self.window, self.busy, handled < BURST) {
            let until = Instant::now() + window * stretch;
            loop {
                poll_once(poll, events, Some(Duration::ZERO))?;
                if !events.is_empty() {
                    return Ok(());
                }
                if Instant::now() >= until {
                    break;
                }
                std::thread::yield_now();
            }
        }
        poll_once(poll, events, timeout)?;
        self.busy = !events.is_empty();
        Ok(())
    }
}

/// One `epoll_wait`; an interrupted one (a signal, or the process stopped and continued)
/// returns no events.
pub fn poll_once(
    poll: &mut Poll,
    events: &mut Events,
    timeout: Option<Duration>,
) -> io::Result<()> {
    match poll.poll(events, timeout) {
        Err(e) if e.kind() == io::ErrorKind::Interrupted => {
            events.clear();
            Ok(())
        }
        r => r,
    }
}
