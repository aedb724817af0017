//! Cancel keys of live tunnels: the BackendKeyData (pid, key) a tunnelled client was given,
//! mapped to what a CancelRequest naming it must reach. Each half keeps one: the downstream
//! forwards only cancel requests for its own live tunnels, the upstream finds the primary
//! backend of a tunnel by it. An entry lives exactly as long as its tunnel ([`Registered`]
//! removes it when dropped), so a map holds at most `limits.max_sessions` entries.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A client's BackendKeyData: (process id, secret key).
pub type Key = (u32, u32);

/// The live keys of one half.
#[derive(Debug)]
pub struct CancelKeys<T>(Mutex<HashMap<Key, T>>);

/// One tunnel's entry; removed when dropped.
#[derive(Debug)]
pub struct Registered<T> {
    keys: Arc<CancelKeys<T>>,
    key: Key,
}

impl<T: Clone> CancelKeys<T> {
    pub fn new() -> Arc<CancelKeys<T>> {
        Arc::new(CancelKeys(Mutex::new(HashMap::new())))
    }

    /// Registers `key` for `target`. None when the key is (0, 0) (no key) or already taken
    /// (then the first tunnel keeps it, and this one cannot be cancelled).
    pub fn register(self: &Arc<Self>, key: Key, target: T) -> Option<Registered<T>> {
        if key == (0, 0) {
            return None;
        }
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if map.contains_key(&key) {
            return None;
        }
        map.insert(key, target);
        Some(Registered {
            keys: self.clone(),
            key,
        })
    }

    /// What `key` names, if a live tunnel has it.
    pub fn get(&self, key: Key) -> Option<T> {
        let map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.get(&key).cloned()
    }

    pub fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<T> Drop for Registered<T> {
    fn drop(&mut self) {
        let mut map = self.keys.0.lock().unwrap_or_else(|e| e.into_inner());
        map.remove(&self.key);
    }
}

/// A new key for a client's BackendKeyData: a positive process id (PostgreSQL's are) and a
/// random secret; never (0, 0).
pub fn new_key() -> Key {
    (rand::random_range(1..=i32::MAX as u32), rand::random())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_lives_as_long_as_its_registration() {
        let keys = CancelKeys::new();
        let r = keys.register((7, 42), "a").unwrap();
        assert_eq!(keys.get((7, 42)), Some("a"));
        assert_eq!(keys.get((7, 43)), None);
        assert!(keys.register((7, 42), "b").is_none(), "a taken key");
        assert_eq!(keys.get((7, 42)), Some("a"));
        drop(r);
        assert!(keys.is_empty());
        assert!(keys.register((0, 0), "none").is_none());
        let (pid, _) = new_key();
        assert!(pid >= 1 && pid <= i32::MAX as u32);
    }
}
