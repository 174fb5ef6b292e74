//! [`Objects`]: the objects of one kind the compiler reads, each behind an `Arc`.
//!
//! In: objects, owned ([`Objects::push`], `From<Vec<K>>`) or shared ([`Objects::push_shared`],
//! what the controller's watch stores hold). Out: `&K` by iteration and indexing, as a
//! `Vec<K>` would give them; `&mut K` copies a shared object first (copy on write).
//!
//! The controller snapshots its stores on every change; with the objects shared, a snapshot
//! of 50,000 routes copies 50,000 pointers rather than 50,000 routes.

use std::ops::{Index, IndexMut};
use std::sync::Arc;

/// The objects of one kind, shared with whoever else holds them.
#[derive(Debug)]
pub struct Objects<K>(Vec<Arc<K>>);

impl<K> Objects<K> {
    /// No objects.
    pub const fn new() -> Self {
        Self(Vec::new())
    }

    /// Appends `object`.
    pub fn push(&mut self, object: K) {
        self.0.push(Arc::new(object));
    }

    /// Inserts `object` at `index` (panics like `Vec::insert` when out of range).
    pub fn insert(&mut self, index: usize, object: K) {
        self.0.insert(index, Arc::new(object));
    }

    /// How many objects there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The objects in order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &K> + ExactSizeIterator + Clone {
        self.0.iter().map(|o| &**o)
    }

    /// Keeps the objects `keep` accepts.
    pub fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) {
        self.0.retain(|o| keep(o));
    }

    /// Removes the objects in `range`.
    pub fn drain(&mut self, range: std::ops::Range<usize>) {
        self.0.drain(range);
    }

    /// Replaces the objects in `range` by `with`.
    pub fn splice(&mut self, range: std::ops::Range<usize>, with: Self) {
        self.0.splice(range, with.0);
    }

    /// The shared pointers, to copy (`Arc::make_mut`) only the objects a caller changes.
    pub fn shared_mut(&mut self) -> impl Iterator<Item = &mut Arc<K>> {
        self.0.iter_mut()
    }
}

impl<K: Clone> Objects<K> {
    /// Removes and returns the object at `index` (panics like `Vec::remove` when out of range).
    pub fn remove(&mut self, index: usize) -> K {
        Arc::unwrap_or_clone(self.0.remove(index))
    }

    /// Removes and returns the last object.
    pub fn pop(&mut self) -> Option<K> {
        self.0.pop().map(Arc::unwrap_or_clone)
    }

    /// The objects, mutable: a shared one is copied first.
    pub fn iter_mut(&mut self) -> impl DoubleEndedIterator<Item = &mut K> + ExactSizeIterator {
        self.0.iter_mut().map(Arc::make_mut)
    }
}

impl<K> Default for Objects<K> {
    fn default() -> Self {
        Self::new()
    }
}

/// Shares every object: copies pointers, not objects.
impl<K> Clone for Objects<K> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<K> From<Vec<K>> for Objects<K> {
    fn from(v: Vec<K>) -> Self {
        Self(v.into_iter().map(Arc::new).collect())
    }
}

impl<K> FromIterator<K> for Objects<K> {
    fn from_iter<I: IntoIterator<Item = K>>(iter: I) -> Self {
        Self(iter.into_iter().map(Arc::new).collect())
    }
}

impl<K> Extend<K> for Objects<K> {
    fn extend<I: IntoIterator<Item = K>>(&mut self, iter: I) {
        self.0.extend(iter.into_iter().map(Arc::new));
    }
}

impl<K> Extend<Arc<K>> for Objects<K> {
    fn extend<I: IntoIterator<Item = Arc<K>>>(&mut self, iter: I) {
        self.0.extend(iter);
    }
}

impl<'a, K> IntoIterator for &'a Objects<K> {
    type Item = &'a K;
    type IntoIter = std::iter::Map<std::slice::Iter<'a, Arc<K>>, fn(&'a Arc<K>) -> &'a K>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter().map(|o| &**o)
    }
}

impl<K> IntoIterator for Objects<K> {
    type Item = Arc<K>;
    type IntoIter = std::vec::IntoIter<Arc<K>>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

/// Mutable objects: a shared one is copied first.
impl<'a, K: Clone> IntoIterator for &'a mut Objects<K> {
    type Item = &'a mut K;
    type IntoIter =
        std::iter::Map<std::slice::IterMut<'a, Arc<K>>, fn(&'a mut Arc<K>) -> &'a mut K>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter_mut().map(Arc::make_mut)
    }
}

impl<K> Index<usize> for Objects<K> {
    type Output = K;

    fn index(&self, index: usize) -> &K {
        &self.0[index]
    }
}

/// The object at `index`, mutable: copied first when shared.
impl<K: Clone> IndexMut<usize> for Objects<K> {
    fn index_mut(&mut self, index: usize) -> &mut K {
        Arc::make_mut(&mut self.0[index])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clone_shares_and_a_write_copies() {
        let mut a: Objects<String> = vec!["x".to_owned(), "y".to_owned()].into();
        let b = a.clone();
        assert!(Arc::ptr_eq(&a.0[0], &b.0[0]));
        a[0].push('!');
        assert_eq!(a.iter().collect::<Vec<_>>(), ["x!", "y"]);
        assert_eq!(b.iter().collect::<Vec<_>>(), ["x", "y"]);
        assert!(Arc::ptr_eq(&a.0[1], &b.0[1]));
    }
}
