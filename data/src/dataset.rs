//! Burn's `Dataset` trait for [`DataView`], so Burn users can feed packed windows (or SFT
//! rows) to Burn's own `DataLoaderBuilder`: `burn::data::dataset::Dataset` is this same trait
//! (crate burn-dataset 0.21).

use burn_dataset::Dataset;

use crate::{DataView, Row};

impl Dataset<Row> for DataView {
    /// Row `index` ([`DataView::row`]); `None` past the end. A row whose files cannot be read
    /// (the mapping was validated when the data was opened, so only a vanished file) is also
    /// `None`, since the trait has no error channel.
    fn get(&self, index: usize) -> Option<Row> {
        self.row(index).ok()
    }

    /// Number of rows ([`DataView::len`]).
    fn len(&self) -> usize {
        DataView::len(self)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use burn_dataset::transform::PartialDataset;
    use burn_dataset::Dataset;

    use crate::{prepare, DataView, PrepareOptions, PreparedData, Row, Split, TokenizerKind};

    #[test]
    fn packed_windows_through_burns_dataset_trait() {
        let tmp = tempfile::tempdir().unwrap();
        let input = tmp.path().join("a.txt");
        std::fs::write(&input, "abcdefg").unwrap(); // a..g = 0..6, EOS 7: 8 tokens
        let mut opts = PrepareOptions::new(TokenizerKind::Char, vec![input], tmp.path().join("out"));
        opts.val_fraction = 0.0;
        opts.progress = false;
        prepare(&opts).unwrap();
        let data = Arc::new(PreparedData::open(&tmp.path().join("out")).unwrap());
        let view = DataView::new(data, Split::Train, 3, true).unwrap();
        let ds: &dyn Dataset<Row> = &view;
        assert_eq!(ds.len(), 2); // (8 - 1) / 3
        let row = ds.get(1).unwrap();
        assert_eq!(row.inputs, vec![3, 4, 5]);
        assert_eq!(row.targets, vec![4, 5, 6]);
        assert_eq!(row.segments, Some(vec![0, 0, 0]));
        assert!(ds.get(2).is_none());
        let rows: Vec<Row> = Dataset::iter(&view).collect();
        assert_eq!(rows[0].inputs, vec![0, 1, 2]);
        // Burn's own transforms compose with it.
        let part = PartialDataset::new(view, 1, 2);
        assert_eq!(part.len(), 1);
        assert_eq!(part.get(0).unwrap().targets, vec![4, 5, 6]);
    }
}
