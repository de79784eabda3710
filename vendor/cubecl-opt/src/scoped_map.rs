use alloc::{vec, vec::Vec};
use core::hash::Hash;
use hashbrown::HashMap;

/// Scoped map for optimizations.
///
/// attnc's patch: each scope is a hash map. Upstream 0.11.3 keeps a `Vec`
/// per scope and searches it linearly, which makes simple CSE quadratic in
/// the number of operations of a block (75% of the time of compiling a
/// large unrolled kernel to C++).
#[derive(Debug)]
pub struct ScopedMap<K, V> {
    scopes: Vec<HashMap<K, V>>,
}

impl<K, V> ScopedMap<K, V> {
    pub fn new() -> Self {
        Self {
            scopes: vec![HashMap::new()],
        }
    }
}

impl<K, V> Default for ScopedMap<K, V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Hash + Eq, V> ScopedMap<K, V> {
    fn depth(&self) -> usize {
        self.scopes.len() - 1
    }

    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        let depth = self.depth();
        self.scopes[depth].insert(key, value)
    }

    pub fn push_scope(&mut self) {
        self.scopes.push(Default::default());
    }

    pub fn pop_scope(&mut self) {
        assert!(self.depth() > 0, "Tried popping root scope");
        self.scopes.pop();
    }

    pub fn get(&self, key: &K) -> Option<&V> {
        for scope in self.scopes.iter().rev() {
            if let Some(val) = scope.get(key) {
                return Some(val);
            }
        }
        None
    }

    pub fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        for scope in self.scopes.iter_mut().rev() {
            if let Some(val) = scope.get_mut(key) {
                return Some(val);
            }
        }
        None
    }
}
