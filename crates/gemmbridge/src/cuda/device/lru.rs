//! A map bounded to a capacity that, when full, makes room by dropping its least recently used
//! entry: the plan caches, so that a program making endless distinct problems keeps a bounded
//! cache while the plans it keeps reusing stay. Knows nothing of what it holds.

use std::collections::BTreeMap;
use std::hash::Hash;

use rustc_hash::FxHashMap;

/// Entries by key, each with the tick of its last use; `order` maps ticks back to keys (the
/// smallest tick is the least recently used entry).
pub(crate) struct Lru<K, V> {
    map: FxHashMap<K, (V, u64)>,
    order: BTreeMap<u64, K>,
    tick: u64,
    capacity: usize,
}

impl<K: Hash + Eq + Clone, V> Lru<K, V> {
    /// An empty map holding at most `capacity` entries (at least one).
    pub fn new(capacity: usize) -> Self {
        Lru { map: FxHashMap::default(), order: BTreeMap::new(), tick: 0, capacity: capacity.max(1) }
    }

    /// The most entries held.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Sets the most entries held (at least one). Nothing is dropped now: the next insertion
    /// drops least recently used entries until the new one fits.
    pub fn set_capacity(&mut self, capacity: usize) {
        self.capacity = capacity.max(1);
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether `k` has an entry (its use is not recorded).
    pub fn contains_key(&self, k: &K) -> bool {
        self.map.contains_key(k)
    }

    /// The entry of `k`, its use recorded.
    pub fn get(&mut self, k: &K) -> Option<&V> {
        self.tick += 1;
        let (v, last) = self.map.get_mut(k)?;
        self.order.remove(last);
        *last = self.tick;
        self.order.insert(self.tick, k.clone());
        Some(v)
    }

    /// Inserts `v` under `k` as just used (replacing an entry of `k`); when that would pass
    /// the capacity, first drops least recently used entries until it fits and returns the
    /// key of the last one dropped.
    pub fn insert(&mut self, k: K, v: V) -> Option<K> {
        self.tick += 1;
        if let Some((_, last)) = self.map.remove(&k) {
            self.order.remove(&last);
        }
        let mut evicted = None;
        while self.map.len() >= self.capacity {
            let Some((_, old)) = self.order.pop_first() else { break };
            self.map.remove(&old);
            evicted = Some(old);
        }
        self.order.insert(self.tick, k.clone());
        self.map.insert(k, (v, self.tick));
        evicted
    }

    /// Keeps only the entries whose key `keep` accepts.
    pub fn retain(&mut self, keep: impl Fn(&K) -> bool) {
        self.map.retain(|k, _| keep(k));
        self.order.retain(|_, k| keep(k));
    }

    /// Drops every entry.
    pub fn clear(&mut self) {
        self.map.clear();
        self.order.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::Lru;

    #[test]
    fn the_least_recently_used_entry_makes_room() {
        let mut m = Lru::new(2);
        assert_eq!(m.insert("a", 1), None);
        assert_eq!(m.insert("b", 2), None);
        assert_eq!(m.get(&"a"), Some(&1)); // a used after b
        assert_eq!(m.insert("c", 3), Some("b"));
        assert!(m.contains_key(&"a") && m.contains_key(&"c") && !m.contains_key(&"b"));
        // contains_key does not count as a use: a (used before c was made) goes next
        assert!(m.contains_key(&"a"));
        assert_eq!(m.insert("d", 4), Some("a"));
        assert_eq!(m.len(), 2);
        assert_eq!(m.get(&"b"), None);
    }

    #[test]
    fn replacing_an_entry_evicts_nothing_and_retain_and_clear_keep_order_consistent() {
        let mut m = Lru::new(2);
        m.insert(1, "x");
        m.insert(2, "y");
        assert_eq!(m.insert(1, "z"), None);
        assert_eq!(m.get(&1), Some(&"z"));
        m.retain(|k| *k != 1);
        assert_eq!((m.len(), m.get(&1)), (1, None));
        assert_eq!(m.insert(3, "w"), None, "room was made by retain");
        assert_eq!(m.insert(4, "v"), Some(2));
        m.clear();
        assert_eq!(m.len(), 0);
        assert_eq!(m.insert(5, "u"), None);
        let mut shrunk = Lru::new(4);
        for k in 0..4 {
            shrunk.insert(k, ());
        }
        shrunk.get(&0);
        shrunk.set_capacity(2);
        assert_eq!((shrunk.len(), shrunk.capacity()), (4, 2), "nothing dropped until the next insertion");
        assert_eq!(shrunk.insert(9, ()), Some(3), "1, 2 and 3 make room, the most recent last");
        assert!(shrunk.contains_key(&0) && shrunk.contains_key(&9) && shrunk.len() == 2);
        let mut one = Lru::new(0); // at least one entry
        assert_eq!(one.insert('a', 0), None);
        assert_eq!(one.insert('b', 0), Some('a'));
    }
}
