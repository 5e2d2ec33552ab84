//! String interning for pods and models: the index stores 4-byte ids, not names.

use std::sync::Arc;

use hashbrown::HashMap;
use parking_lot::RwLock;

/// A thread-safe, append-only interner.
#[derive(Default)]
pub(crate) struct Interner {
    inner: RwLock<InternerInner>,
}

#[derive(Default)]
struct InternerInner {
    by_name: HashMap<Arc<str>, u32>,
    names: Vec<Arc<str>>,
}

impl Interner {
    /// The id of `name`, allocating one on first sight.
    pub(crate) fn intern(&self, name: &str) -> u32 {
        if let Some(id) = self.inner.read().by_name.get(name) {
            return *id;
        }
        let mut inner = self.inner.write();
        if let Some(id) = inner.by_name.get(name) {
            return *id;
        }
        let id = inner.names.len() as u32;
        let name: Arc<str> = Arc::from(name);
        inner.names.push(name.clone());
        inner.by_name.insert(name, id);
        id
    }

    /// The id of `name` if it was interned.
    pub(crate) fn get(&self, name: &str) -> Option<u32> {
        self.inner.read().by_name.get(name).copied()
    }

    /// The name behind `id` (empty for an id never handed out).
    pub(crate) fn name(&self, id: u32) -> Arc<str> {
        self.inner
            .read()
            .names
            .get(id as usize)
            .cloned()
            .unwrap_or_else(|| Arc::from(""))
    }
}
