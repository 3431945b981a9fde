//! Waiting for events with busy polling.
//!
//! A request that crosses processes (client → server, Primary → peers and back) pays a wakeup
//! for every hop into a sleeping process, and on virtual machines a wakeup costs more than the
//! work. After a burst of events the loop therefore polls without sleeping for a short
//! window, yielding the CPU between polls (spinning without yielding starves the very
//! processes it waits for when there are fewer cores than busy processes). An idle loop
//! blocks as usual.

use mio::{Events, Poll};
use std::io;
use std::time::{Duration, Instant};

pub struct Waiter {
    window: Option<Duration>,
    /// The last wait returned events: more are likely soon.
    busy: bool,
}

impl Waiter {
    /// `window` zero: never spin.
    pub fn new(window: Duration) -> Waiter {
        Waiter {
            window: Some(window).filter(|w| !w.is_zero()),
            busy: false,
        }
    }

    /// Fills `events`, waiting at most `timeout` (`None`: indefinitely) once the busy
    /// window, if any, has passed without events.
    pub fn wait(
        &mut self,
        poll: &mut Poll,
        events: &mut Events,
        timeout: Option<Duration>,
    ) -> io::Result<()> {
        self.wait_stretched(poll, events, timeout, 1)
    }

    /// [`wait`](Self::wait) with the busy window `stretch` times as long: for when the
    /// caller knows the next event is due after a longer chain of hops than usual.
    pub fn wait_stretched(
        &mut self,
        poll: &mut Poll,
        events: &mut Events,
        timeout: Option<Duration>,
        stretch: u32,
    ) -> io::Result<()> {
        if let (Some(window), true) = (self.window, self.busy) {
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

fn poll_once(poll: &mut Poll, events: &mut Events, timeout: Option<Duration>) -> io::Result<()> {
    match poll.poll(events, timeout) {
        Err(e) if e.kind() == io::ErrorKind::Interrupted => {
            events.clear();
            Ok(())
        }
        r => r,
    }
}
