//! Sets of node ids (ids are below 32): which peers a write still waits on, which
//! acknowledged it, which missed it, which a read already tried, which nodes a
//! replicated write targets on the wire. One type, one meaning: bit `n` is node id `n`.

use super::spec::NodeId;

#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct NodeSet(u32);

impl NodeSet {
    pub const EMPTY: NodeSet = NodeSet(0);

    /// The set holding only `id`.
    pub fn one(id: NodeId) -> NodeSet {
        assert!(id < 32, "node ids are below 32");
        NodeSet(1 << id)
    }

    /// From the wire's `targets` field (bit `n` = node id `n`).
    pub fn from_bits(bits: u32) -> NodeSet {
        NodeSet(bits)
    }

    /// For the wire.
    pub fn bits(self) -> u32 {
        self.0
    }

    pub fn contains(self, id: NodeId) -> bool {
        id < 32 && self.0 & (1 << id) != 0
    }

    pub fn insert(&mut self, id: NodeId) {
        *self = self.union(NodeSet::one(id));
    }

    pub fn remove(&mut self, id: NodeId) {
        self.0 &= !NodeSet::one(id).0;
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn union(self, other: NodeSet) -> NodeSet {
        NodeSet(self.0 | other.0)
    }

    /// The nodes of this set not in `other`.
    pub fn minus(self, other: NodeSet) -> NodeSet {
        NodeSet(self.0 & !other.0)
    }

    pub fn intersects(self, other: NodeSet) -> bool {
        self.0 & other.0 != 0
    }

    /// Whether every member is also in `other`.
    pub fn is_subset(self, other: NodeSet) -> bool {
        self.0 & !other.0 == 0
    }

    pub fn iter(self) -> impl Iterator<Item = NodeId> {
        (0..32u8).filter(move |&id| self.contains(id))
    }
}

impl std::ops::BitOrAssign for NodeSet {
    fn bitor_assign(&mut self, other: NodeSet) {
        *self = self.union(other);
    }
}

impl std::ops::SubAssign for NodeSet {
    /// Removes `other`'s members.
    fn sub_assign(&mut self, other: NodeSet) {
        self.0 &= !other.0;
    }
}

impl FromIterator<NodeId> for NodeSet {
    fn from_iter<I: IntoIterator<Item = NodeId>>(ids: I) -> NodeSet {
        let mut s = NodeSet::EMPTY;
        for id in ids {
            s.insert(id);
        }
        s
    }
}

impl std::fmt::Debug for NodeSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_in_and_out() {
        let mut s = NodeSet::EMPTY;
        assert!(s.is_empty());
        s.insert(0);
        s.insert(31);
        s.insert(4);
        assert!(s.contains(0) && s.contains(4) && s.contains(31) && !s.contains(1));
        assert!(!s.contains(40), "ids of 32 and more are never members");
        assert_eq!(s.iter().collect::<Vec<_>>(), [0, 4, 31]);
        assert_eq!(format!("{s:?}"), "{0, 4, 31}");
        s.remove(4);
        let mut t = s;
        t |= NodeSet::one(7);
        t -= NodeSet::one(0);
        assert_eq!(t.iter().collect::<Vec<_>>(), [7, 31]);
        assert_eq!(s, [0, 31].into_iter().collect());
        assert_eq!(NodeSet::from_bits(s.bits()), s);
        assert!(NodeSet::one(0).is_subset(s) && !NodeSet::one(1).is_subset(s));
        assert!(s.intersects(NodeSet::one(31)) && !s.intersects(NodeSet::one(2)));
    }

    #[test]
    #[should_panic(expected = "below 32")]
    fn an_id_of_32_is_refused() {
        NodeSet::one(32);
    }
}
