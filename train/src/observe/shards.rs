//! How ZeRO-1 splits a model's parameters over ranks ([`Partition`]): used by the step, which
//! shards the AdamW state ([`crate::step::shard`]), and by the accounting, which estimates what
//! the largest share costs ([`super::accounting`]).

use burn::module::Module;
use burn::tensor::backend::Backend;

/// Which rank owns each parameter tensor's optimizer state: a deterministic, balanced split by
/// element count (PyTorch's `ZeroRedundancyOptimizer` partition: tensors from the largest
/// down, each to the rank that owns the fewest elements so far, the lower rank on a tie; equal
/// sizes in module order).
///
/// Whole tensors are assigned, so the split is only as even as the tensors allow: a tensor
/// larger than `1/W` of the model (a large embedding on a small model) makes its owner hold
/// more.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Partition {
    /// The owner of each float parameter tensor, in module visiting order.
    pub owners: Vec<usize>,
    /// The elements owned by each rank.
    pub elements: Vec<usize>,
}

impl Partition {
    /// The split of tensors of `sizes` elements (in module order) over `world_size` ranks.
    pub fn balanced(sizes: &[usize], world_size: usize) -> Self {
        let world_size = world_size.max(1);
        let mut order: Vec<usize> = (0..sizes.len()).collect();
        order.sort_by_key(|&i| (std::cmp::Reverse(sizes[i]), i));
        let (mut owners, mut elements) = (vec![0; sizes.len()], vec![0; world_size]);
        for i in order {
            let rank = (0..world_size).min_by_key(|&r| (elements[r], r)).expect("at least one rank");
            owners[i] = rank;
            elements[rank] += sizes[i];
        }
        Self { owners, elements }
    }

    /// The split of `module`'s float parameters over `world_size` ranks.
    pub fn of<B: Backend, M: Module<B>>(module: &M, world_size: usize) -> Self {
        Self::balanced(&ember_model::lm::param_sizes(module), world_size)
    }

    /// The most elements any rank owns (the rank that needs the most memory).
    pub fn largest(&self) -> usize {
        self.elements.iter().copied().max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// By hand: sizes 10, 3, 7, 7, 1 from the largest down, each to the least-loaded rank.
    /// Two ranks: 10 → 0; 7 (3rd) → 1; 7 (4th) → 1 (7 < 10); 3 → 0 (10 < 14); 1 → 0 (13 < 14).
    /// Three: 10 → 0, 7 → 1, 7 → 2, 3 → 1 (tie of 7 and 7: the lower rank), 1 → 2 (7 < 10).
    #[test]
    fn balanced_partition_by_hand() {
        let sizes = [10, 3, 7, 7, 1];
        let two = Partition::balanced(&sizes, 2);
        assert_eq!(two.owners, [0, 0, 1, 1, 0]);
        assert_eq!(two.elements, [14, 14]);
        let three = Partition::balanced(&sizes, 3);
        assert_eq!(three.owners, [0, 1, 1, 2, 2]);
        assert_eq!(three.elements, [10, 10, 8]);
        assert_eq!(Partition::balanced(&sizes, 1).owners, [0; 5]);
        // More ranks than tensors: the last own nothing.
        let seven = Partition::balanced(&sizes, 7);
        assert_eq!(seven.elements, [10, 7, 7, 3, 1, 0, 0]);
        // Deterministic, and a pure function of the sizes.
        assert_eq!(Partition::balanced(&sizes, 3), three);
        assert_eq!((two.largest(), three.largest(), seven.largest()), (14, 10, 10));
    }
}
