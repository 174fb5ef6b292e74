//! Open connections per client address on each port (ClientPolicy
//! `limits.maxConnectionsPerClient`). In: a connection's port and client address (after any
//! PROXY header). Out: a [`Slot`] held while the connection lives, or `None` when the client
//! has its port's maximum open already (the connection is then closed unanswered).
//!
//! One lock per connection opened and closed, never per request. Entries are removed when
//! their count drops to zero, so the map holds only clients with connections open.

use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

use crate::FastMap;

/// Counts of open connections by (table port, client address).
#[derive(Debug, Default)]
pub(crate) struct PerClient {
    open: Mutex<FastMap<(u16, IpAddr), u32>>,
}

/// One counted connection; dropping it uncounts it.
#[derive(Debug)]
pub(crate) struct Slot {
    owner: Arc<PerClient>,
    key: (u16, IpAddr),
}

impl PerClient {
    /// Counts a connection of `client` on `port` unless it has `max` open already.
    pub fn enter(self: &Arc<Self>, port: u16, client: IpAddr, max: u32) -> Option<Slot> {
        let key = (port, client);
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let n = open.entry(key).or_insert(0);
        if *n >= max {
            if *n == 0 {
                open.remove(&key);
            }
            return None;
        }
        *n += 1;
        Some(Slot {
            owner: self.clone(),
            key,
        })
    }

    /// Clients with connections open (for tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self
            .owner
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = open.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_gets_at_most_max_and_a_closed_one_frees_its_place() {
        let pc = Arc::new(PerClient::default());
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        let one = pc.enter(80, a, 2).unwrap();
        let two = pc.enter(80, a, 2).unwrap();
        assert!(pc.enter(80, a, 2).is_none(), "a third one is refused");
        assert!(pc.enter(80, b, 2).is_some(), "another client is apart");
        assert!(pc.enter(443, a, 2).is_some(), "another port is apart");
        drop(one);
        let three = pc.enter(80, a, 2).unwrap();
        drop((two, three));
        assert_eq!(
            pc.len(),
            0,
            "no entry is left for clients without connections"
        );
        assert!(pc.enter(80, a, 0).is_none());
        assert_eq!(pc.len(), 0);
    }
}
