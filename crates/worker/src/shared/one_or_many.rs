//! A call's tasks (and their runs) as a slice that needs no vector for the
//! usual call of one task: one allocation fewer per task each.

use std::ops::Deref;

/// One item, or any number of them, read as a slice.
#[derive(Debug)]
pub(crate) enum OneOrMany<T> {
    One([T; 1]),
    Many(Vec<T>),
}

impl<T> Deref for OneOrMany<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        match self {
            OneOrMany::One(one) => one,
            OneOrMany::Many(many) => many,
        }
    }
}

impl<T> FromIterator<T> for OneOrMany<T> {
    fn from_iter<I: IntoIterator<Item = T>>(items: I) -> Self {
        let mut items = items.into_iter();
        let Some(first) = items.next() else { return OneOrMany::Many(Vec::new()) };
        let Some(second) = items.next() else { return OneOrMany::One([first]) };
        let mut many = Vec::with_capacity(2 + items.size_hint().0);
        many.extend([first, second]);
        many.extend(items);
        OneOrMany::Many(many)
    }
}

impl<'a, T> IntoIterator for &'a OneOrMany<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_number_of_items_reads_back_in_order() {
        for n in 0..5 {
            let items: OneOrMany<usize> = (0..n).collect();
            assert_eq!(&items[..], &(0..n).collect::<Vec<_>>()[..]);
            assert_eq!(matches!(items, OneOrMany::One(_)), n == 1, "one item needs no vector");
        }
    }
}
